//! Recording and submission: ops go into one pending command encoder, dispatches into one
//! compute pass, their parameters into one buffer a submission, and the whole is submitted
//! every [`OPS_PER_SUBMIT`] dispatches or when the host needs data; the launches and the host
//! time they take are counted for `submit_stats`.

use std::sync::atomic::Ordering;

use kiln_core::Result;

use super::{err, Device};

/// Dispatches recorded before the pending encoder is submitted.
pub(super) const OPS_PER_SUBMIT: usize = 96;

/// Bytes of a submission's parameter buffer (`Pending::arena`): a submission ends early if
/// its dispatches' parameters would overflow it.
const ARENA_BYTES: u64 = 64 << 10;

/// What is recorded but not yet submitted.
#[derive(Default)]
pub(super) struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass the dispatches go into, open until a copy or the submission (one
    /// pass for a run of dispatches: wgpu still orders each dispatch after the writes it reads).
    pass: Option<wgpu::ComputePass<'static>>,
    ops: usize,
    /// This submission's parameter buffer: every dispatch's parameters at its own aligned
    /// offset, their bytes staged in `staged` and written to it just before the submission
    /// (one buffer a submission instead of one a dispatch: a buffer's creation and release
    /// were a quarter of the host's time per dispatch).
    arena: Option<wgpu::Buffer>,
    staged: Vec<u8>,
}

impl Device {
    /// Runs `f`, charging its host time to [`Device::submit_stats`]: the thread's CPU time
    /// where the platform gives it (a driver may hold a submission until the GPU is done with
    /// earlier work, as lavapipe's does, and that is the GPU's time, not the host's), else the
    /// wall clock's.
    pub(crate) fn timed<R>(&self, f: impl FnOnce() -> R) -> R {
        let cpu = kiln_core::time::thread_cpu_time();
        let t = kiln_core::time::Instant::now();
        let r = f();
        let took = match (cpu, kiln_core::time::thread_cpu_time()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => t.elapsed(),
        };
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        self.submit_ns.fetch_add(ns, Ordering::Relaxed);
        r
    }

    /// Dispatches, copies and writes recorded so far, and the host time `execute` and
    /// `upload` took.
    pub(crate) fn submit_stats(&self) -> kiln_core::backend::SubmitStats {
        kiln_core::backend::SubmitStats {
            launches: self.launches.load(Ordering::Relaxed),
            host_seconds: self.submit_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    /// Records into the pending encoder (opening one if needed, and ending an open compute
    /// pass first); true when enough has been recorded that the caller should submit.
    pub(super) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) -> Result<bool> {
        self.recorded(|p| {
            p.pass = None;
            f(self.encoder(p));
        })
    }

    /// Records into the pending compute pass (opening the encoder and the pass if needed);
    /// true when enough has been recorded that the caller should submit.
    pub(super) fn record_pass(
        &self,
        f: impl FnOnce(&mut wgpu::ComputePass<'static>),
    ) -> Result<bool> {
        self.recorded(|p| {
            if p.pass.is_none() {
                let pass = self
                    .encoder(p)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: None,
                    })
                    .forget_lifetime();
                p.pass = Some(pass);
            }
            if let Some(pass) = p.pass.as_mut() {
                f(pass);
            }
        })
    }

    /// Runs `f` on the pending state and counts one launch or copy; true when enough has been
    /// recorded that the caller should submit.
    fn recorded(&self, f: impl FnOnce(&mut Pending)) -> Result<bool> {
        let mut p = self
            .pending
            .lock()
            .map_err(|_| err("command state poisoned"))?;
        f(&mut p);
        p.ops += 1;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(p.ops >= OPS_PER_SUBMIT)
    }

    /// The pending encoder, opened if there is none.
    fn encoder<'p>(&self, p: &'p mut Pending) -> &'p mut wgpu::CommandEncoder {
        p.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }

    /// A place for `bytes` of parameters in the pending submission's parameter buffer: the
    /// buffer and the offset (the adapter's storage offset alignment). Submits what is
    /// pending first when the buffer has no room left.
    pub(super) fn param_slot(&self, bytes: &[u8]) -> Result<(wgpu::Buffer, u64)> {
        let align = self.limits.min_storage_buffer_offset_alignment.max(4) as u64;
        let len = bytes.len() as u64;
        if len > ARENA_BYTES {
            return Err(err(format!("{len} bytes of kernel parameters")));
        }
        let fits = |p: &Pending| {
            p.arena.is_none()
                || (p.staged.len() as u64).next_multiple_of(align) + len <= ARENA_BYTES
        };
        let full = {
            let p = self
                .pending
                .lock()
                .map_err(|_| err("command state poisoned"))?;
            !fits(&p)
        };
        if full {
            self.flush()?;
        }
        let mut p = self
            .pending
            .lock()
            .map_err(|_| err("command state poisoned"))?;
        let arena = p
            .arena
            .get_or_insert_with(|| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kiln params"),
                    size: ARENA_BYTES,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
            .clone();
        let at = (p.staged.len() as u64).next_multiple_of(align);
        p.staged.resize(at as usize, 0);
        p.staged.extend_from_slice(bytes);
        Ok((arena, at))
    }

    /// Submits the pending encoder, if any.
    pub(crate) fn flush(&self) -> Result<()> {
        let enc = {
            let mut p = self
                .pending
                .lock()
                .map_err(|_| err("command state poisoned"))?;
            p.ops = 0;
            // The pass ends before its encoder does.
            p.pass = None;
            if let Some(arena) = p.arena.take() {
                // Whole u32 words at offsets of at least 4 bytes: a multiple of 4 long.
                self.queue.write_buffer(&arena, 0, &p.staged);
                p.staged.clear();
            }
            p.encoder.take()
        };
        if let Some(enc) = enc {
            self.queue.submit([enc.finish()]);
        }
        Ok(())
    }
}
