//! The wgpu device: adapter choice, buffers, the pipeline cache and batched command recording.
//!
//! Ops are recorded into one pending command encoder and submitted every
//! `submit::OPS_PER_SUBMIT` dispatches, or when the host needs data (download, upload, synchronize),
//! so a decode step is a handful of submissions, not one per op. Every tensor is bound as the
//! smallest aligned range of its buffer that covers it, so a model whose buffers exceed the
//! adapter's largest storage binding still runs as long as each op's operands fit (the
//! launchers split the ones that do not).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kiln_core::backend::{next_backend_id, Capabilities, DeviceKind};
use kiln_core::tensor::{BackendId, Storage, Tensor, TensorDesc};
use kiln_core::{Error, Result};
use wgpu::util::DeviceExt;

use crate::kernels::Kernel;

mod submit;
use submit::Pending;

type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// An error scope around work whose errors should name it. Natively; in a browser the
/// scope's answer comes only through the event loop, so none is opened there and such errors
/// reach the device's uncaptured-error handler (reported at the next wait or read).
#[cfg(not(target_arch = "wasm32"))]
fn push_scope(device: &wgpu::Device, filter: wgpu::ErrorFilter) -> Option<wgpu::ErrorScopeGuard> {
    Some(device.push_error_scope(filter))
}
#[cfg(target_arch = "wasm32")]
fn push_scope(_: &wgpu::Device, _: wgpu::ErrorFilter) -> Option<()> {
    None
}

/// The first error the scope caught.
#[cfg(not(target_arch = "wasm32"))]
fn pop_scope(scope: Option<wgpu::ErrorScopeGuard>) -> Option<wgpu::Error> {
    pollster::block_on(scope?.pop())
}
#[cfg(target_arch = "wasm32")]
fn pop_scope(_: Option<()>) -> Option<wgpu::Error> {
    None
}

/// A value sent once from a callback and awaited (or taken) once.
struct OneShot<T> {
    value: Option<T>,
    waker: Option<std::task::Waker>,
}

struct Sender<T>(Arc<Mutex<OneShot<T>>>);
struct Receiver<T>(Arc<Mutex<OneShot<T>>>);

fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Mutex::new(OneShot {
        value: None,
        waker: None,
    }));
    (Sender(slot.clone()), Receiver(slot))
}

impl<T> Sender<T> {
    fn send(self, v: T) {
        let waker = match self.0.lock() {
            Ok(mut s) => {
                s.value = Some(v);
                s.waker.take()
            }
            Err(_) => None,
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The value, if it was sent.
    fn try_take(&self) -> Option<T> {
        self.0.lock().ok()?.value.take()
    }
}

impl<T> std::future::Future for Receiver<T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let Ok(mut s) = self.0.lock() else {
            return std::task::Poll::Pending;
        };
        match s.value.take() {
            Some(v) => std::task::Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

/// One device buffer, the storage behind wgpu tensors.
pub(crate) struct GpuBuffer {
    pub(crate) buffer: wgpu::Buffer,
    /// The tensor-visible length; the wgpu buffer is rounded up to 4 bytes.
    len: usize,
    backend: BackendId,
}

impl Storage for GpuBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn backend(&self) -> BackendId {
        self.backend
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A tensor bound as a buffer range: `start..start+size` of its buffer, with the tensor's
/// first byte `byte_off` bytes into the range.
pub(crate) struct Bound<'a> {
    buffer: &'a wgpu::Buffer,
    start: u64,
    size: u64,
    pub(crate) byte_off: u32,
}

pub(crate) struct Device {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    pub(crate) caps: Capabilities,
    pub(crate) id: BackendId,
    /// Each pipeline, and whether its kernel reads the i-quant grid table.
    pipelines: Mutex<HashMap<&'static str, (Arc<wgpu::ComputePipeline>, bool)>>,
    /// The i-quants' grid table (`iquant.wgsl`'s `iq_grid`), uploaded at its first use.
    iq_grid: std::sync::OnceLock<wgpu::Buffer>,
    pending: Mutex<Pending>,
    /// The first device error seen (validation, out of memory, device lost); reported by the
    /// next call that waits on the device.
    error: Arc<Mutex<Option<String>>>,
    /// A 4-byte buffer bound where an optional input is absent.
    pub(crate) dummy: Tensor,
    /// `KILN_WGPU_PROFILE=1`: per kernel, (dispatches, microseconds), each dispatch waited
    /// for; printed when the device closes.
    profile: Option<Mutex<HashMap<&'static str, (u64, u64)>>>,
    /// Dispatches, copies and uploads recorded so far (`submit_stats`).
    launches: AtomicU64,
    /// Host nanoseconds the backend's `execute` and `upload` took (`submit_stats`).
    submit_ns: AtomicU64,
}

impl Drop for Device {
    fn drop(&mut self) {
        let Some(profile) = &self.profile else {
            return;
        };
        let Ok(p) = profile.lock() else {
            return;
        };
        let mut rows: Vec<_> = p.iter().collect();
        rows.sort_by(|a, b| b.1 .1.cmp(&a.1 .1));
        let total: u64 = rows.iter().map(|r| r.1 .1).sum();
        eprintln!("wgpu kernel profile (each dispatch waited for):");
        eprintln!(
            "{:>12} {:>8} {:>10} {:>6}  kernel",
            "total us", "calls", "us/call", "%"
        );
        for (name, (calls, us)) in rows {
            eprintln!(
                "{us:>12} {calls:>8} {:>10.1} {:>6.1}  {name}",
                *us as f64 / (*calls).max(1) as f64,
                100.0 * *us as f64 / total.max(1) as f64
            );
        }
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::backend("wgpu", msg)
}

fn device_kind(t: wgpu::DeviceType) -> DeviceKind {
    match t {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::DiscreteGpu,
        wgpu::DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu,
        wgpu::DeviceType::VirtualGpu => DeviceKind::VirtualGpu,
        wgpu::DeviceType::Cpu => DeviceKind::SoftwareGpu,
        wgpu::DeviceType::Other => DeviceKind::Other,
    }
}

/// Preference among adapters: discrete, integrated, virtual, software, other.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

impl Device {
    /// Picks an adapter (`KILN_WGPU_ADAPTER` matches a name substring; otherwise the most
    /// capable kind) and opens a device with the adapter's own limits.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn open() -> Result<Device> {
        pollster::block_on(Self::open_async())
    }

    /// [`Device::open`] without blocking: in a browser, adapters and devices arrive through
    /// the event loop.
    pub(crate) async fn open_async() -> Result<Device> {
        let instance = crate::instance();
        let adapters = instance.enumerate_adapters(crate::BACKENDS).await;
        if adapters.is_empty() {
            return Err(Error::NotAvailable(crate::NO_ADAPTER.into()));
        }
        let wanted = std::env::var("KILN_WGPU_ADAPTER")
            .ok()
            .filter(|s| !s.is_empty());
        let adapter = match &wanted {
            Some(name) => {
                let lname = name.to_lowercase();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&lname))
                    .ok_or_else(|| {
                        Error::NotAvailable(format!(
                            "wgpu: no adapter's name contains KILN_WGPU_ADAPTER={name:?} (see `kiln info`)"
                        ))
                    })?
            }
            None => adapters
                .into_iter()
                .min_by_key(|a| rank(a.get_info().device_type))
                .ok_or_else(|| Error::NotAvailable(crate::NO_ADAPTER.into()))?,
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let offered = adapter.features();
        let features = offered & (wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| err(format!("{}: cannot open a device: {e}", info.name)))?;
        let error = Arc::new(Mutex::new(None::<String>));
        let sink = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!("wgpu device error: {e}");
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| e.to_string());
            }
        }));
        let lost = error.clone();
        device.set_device_lost_callback(move |reason, msg| {
            tracing::error!("wgpu device lost ({reason:?}): {msg}");
            if let Ok(mut slot) = lost.lock() {
                slot.get_or_insert_with(|| format!("the GPU device was lost ({reason:?}): {msg}"));
            }
        });
        // A browser does not name its adapter to wgpu.
        let described = if info.name.is_empty() {
            "the browser's WebGPU adapter".to_string()
        } else {
            format!("{} ({:?}, {})", info.name, info.backend, info.driver)
        };
        let caps = Capabilities {
            device: described,
            kind: device_kind(info.device_type),
            f16: features.contains(wgpu::Features::SHADER_F16),
            bf16: false,
            subgroup_size: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some(adapter.get_info().subgroup_min_size),
            max_buffer_bytes: limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size),
            memory_bytes: None,
            parallelism: 1,
        };
        let id = next_backend_id();
        let dummy_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln dummy"),
            size: 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let dummy = Tensor::new(
            Arc::new(GpuBuffer {
                buffer: dummy_buf,
                len: 4,
                backend: id,
            }),
            0,
            TensorDesc::new(kiln_core::tensor::DType::F32, [1]),
        )?;
        tracing::info!(adapter = %caps.device, "wgpu device opened");
        Ok(Device {
            device,
            queue,
            limits,
            caps,
            id,
            pipelines: Mutex::new(HashMap::new()),
            iq_grid: std::sync::OnceLock::new(),
            pending: Mutex::new(Pending::default()),
            error,
            dummy,
            profile: std::env::var("KILN_WGPU_PROFILE")
                .is_ok_and(|v| !v.is_empty() && v != "0")
                .then(|| Mutex::new(HashMap::new())),
            launches: AtomicU64::new(0),
            submit_ns: AtomicU64::new(0),
        })
    }

    /// Fails with the first device error seen, if any.
    fn check_error(&self) -> Result<()> {
        match self.error.lock() {
            Ok(mut slot) => match slot.take() {
                Some(e) => Err(err(format!("device error: {e}"))),
                None => Ok(()),
            },
            Err(_) => Err(err("device error state poisoned")),
        }
    }

    pub(crate) fn alloc(&self, desc: &TensorDesc) -> Result<Tensor> {
        let len = desc
            .nbytes()
            .ok_or_else(|| err(format!("{desc}: not a whole number of blocks")))?;
        let size = (len.max(4) as u64).div_ceil(4) * 4;
        if size > self.limits.max_buffer_size {
            return Err(err(format!(
                "{desc}: {size} bytes is more than the adapter's largest buffer ({} bytes)",
                self.limits.max_buffer_size
            )));
        }
        // Large allocations are where device memory runs out: catch that here, as an error
        // naming the tensor, rather than at a later submission.
        let scope =
            (size >= 1 << 24).then(|| push_scope(&self.device, wgpu::ErrorFilter::OutOfMemory));
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pop_scope(scope.flatten()) {
            return Err(err(format!("{desc}: cannot allocate {size} bytes: {e}")));
        }
        Tensor::new(
            Arc::new(GpuBuffer {
                buffer,
                len,
                backend: self.id,
            }),
            0,
            desc.clone(),
        )
    }

    pub(crate) fn buffer_of<'a>(&self, t: &'a Tensor) -> Result<&'a GpuBuffer> {
        t.storage()
            .as_any()
            .downcast_ref::<GpuBuffer>()
            .filter(|b| b.backend == self.id)
            .ok_or_else(|| err(format!("{} is not a tensor of this wgpu device", t.desc())))
    }

    /// Rows of `rows` rows of `row_bytes` bytes each that one storage binding can hold.
    pub(crate) fn rows_per_binding(&self, rows: usize, row_bytes: usize) -> usize {
        if self.fits_binding(rows.saturating_mul(row_bytes)) {
            return rows;
        }
        let room = (self.limits.max_storage_buffer_binding_size as usize)
            .saturating_sub(self.limits.min_storage_buffer_offset_alignment as usize + 4);
        (room / row_bytes.max(1)).max(1)
    }

    /// Waits for everything submitted so far.
    pub(crate) fn wait(&self) -> Result<()> {
        self.flush()?;
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| err(format!("waiting for the device: {e}")))?;
        self.check_error()
    }

    /// `[start, end)` rounded out to 4 bytes, within the buffer.
    fn word_range<'a>(&self, t: &'a Tensor) -> Result<(u64, u64, &'a wgpu::Buffer)> {
        let b = self.buffer_of(t)?;
        let start = (t.offset() as u64) & !3;
        let end = ((t.offset() + t.nbytes()) as u64).div_ceil(4) * 4;
        Ok((start, end.min(b.buffer.size()), &b.buffer))
    }

    /// Copies `t`'s words into a new mappable buffer and asks for it to be mapped: the
    /// buffer, where `t` starts in it, and the map's outcome to wait for.
    fn start_download(&self, t: &Tensor) -> Result<(wgpu::Buffer, usize, Receiver<MapResult>)> {
        let (start, end, buffer) = self.word_range(t)?;
        let size = end - start;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.record(|enc| enc.copy_buffer_to_buffer(buffer, start, &staging, 0, size))?;
        self.flush()?;
        let (tx, rx) = oneshot();
        staging.map_async(wgpu::MapMode::Read, .., move |r| tx.send(r));
        Ok((staging, (t.offset() as u64 - start) as usize, rx))
    }

    /// `t`'s bytes from a mapped staging buffer.
    fn finish_download(
        t: &Tensor,
        staging: wgpu::Buffer,
        head: usize,
        mapped: MapResult,
    ) -> Result<Vec<u8>> {
        mapped.map_err(|e| err(format!("mapping a buffer for download: {e}")))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| err(format!("reading a mapped buffer: {e}")))?;
            view[head..head + t.nbytes()].to_vec()
        };
        staging.unmap();
        Ok(out)
    }

    /// Reads `t` back, waiting for the device. Not on the web, where a buffer maps only once
    /// control returns to the event loop: there [`Device::download_async`] reads.
    pub(crate) fn download(&self, t: &Tensor) -> Result<Vec<u8>> {
        if t.nbytes() == 0 {
            return Ok(Vec::new());
        }
        if cfg!(target_arch = "wasm32") {
            return Err(err(
                "a blocking read of a GPU buffer is not possible in a browser (download_async reads)",
            ));
        }
        let (staging, head, rx) = self.start_download(t)?;
        self.wait()?;
        let mapped = rx
            .try_take()
            .ok_or_else(|| err("buffer map callback never ran"))?;
        Self::finish_download(t, staging, head, mapped)
    }

    /// Reads `t` back without blocking the thread.
    pub(crate) async fn download_async(&self, t: &Tensor) -> Result<Vec<u8>> {
        if t.nbytes() == 0 {
            return Ok(Vec::new());
        }
        let (staging, head, rx) = self.start_download(t)?;
        if !cfg!(target_arch = "wasm32") {
            // Natively the map completes as the device is polled.
            self.wait()?;
        }
        let mapped = rx.await;
        self.check_error()?;
        Self::finish_download(t, staging, head, mapped)
    }

    pub(crate) fn upload(&self, t: &Tensor, bytes: &[u8]) -> Result<()> {
        if bytes.len() != t.nbytes() {
            return Err(err(format!(
                "upload of {} bytes into {} ({} bytes)",
                bytes.len(),
                t.desc(),
                t.nbytes()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        // Commands recorded earlier must see the buffer's old contents: submit them first
        // (queue writes land before the next submission's commands).
        self.flush()?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        let (start, end, buffer) = self.word_range(t)?;
        let visible = self.buffer_of(t)?.len as u64;
        if start == t.offset() as u64 && end - start == bytes.len() as u64 {
            self.queue.write_buffer(buffer, start, bytes);
        } else if start == t.offset() as u64 && t.offset() as u64 + bytes.len() as u64 == visible {
            // The window ends where the buffer's tensors do: the rest of its last word is
            // padding no tensor sees, so zeros fill it (no read of the old words, which a
            // browser could not do here).
            let mut words = bytes.to_vec();
            words.resize((end - start) as usize, 0);
            self.queue.write_buffer(buffer, start, &words);
        } else {
            // A window that starts or ends inside a word: its whole words are written as they
            // are, and the one or two words it shares with other bytes are patched on the
            // device (a browser cannot read them back first).
            let off = t.offset();
            let end = off + bytes.len();
            let inner_start = off.div_ceil(4) * 4;
            let inner_end = (end / 4 * 4).max(inner_start);
            if inner_end > inner_start {
                let whole = &bytes[inner_start - off..inner_end - off];
                self.queue.write_buffer(buffer, inner_start as u64, whole);
            }
            if inner_start > off {
                self.patch_word(buffer, off, &bytes[..inner_start.min(end) - off])?;
            }
            if end > inner_end {
                self.patch_word(buffer, inner_end, &bytes[inner_end - off..])?;
            }
        }
        Ok(())
    }

    /// Writes `piece` at byte `at` of `buffer`, inside one 32-bit word, keeping the word's
    /// other bytes.
    fn patch_word(&self, buffer: &wgpu::Buffer, at: usize, piece: &[u8]) -> Result<()> {
        let word = at / 4 * 4;
        let dst = Tensor::new(
            Arc::new(GpuBuffer {
                buffer: buffer.clone(),
                len: buffer.size() as usize,
                backend: self.id,
            }),
            word,
            TensorDesc::new(kiln_core::tensor::DType::U32, [1]),
        )?;
        crate::ops::patch_word(self, &dst, at - word, piece)
    }

    /// The smallest range of `t`'s buffer that covers it and starts on the adapter's storage
    /// offset alignment.
    pub(crate) fn bind<'a>(&self, t: &'a Tensor) -> Result<Bound<'a>> {
        let b = self.buffer_of(t)?;
        let align = self.limits.min_storage_buffer_offset_alignment.max(4) as u64;
        let start = (t.offset() as u64 / align) * align;
        let end = ((t.offset() + t.nbytes()).max(t.offset() + 1) as u64).div_ceil(4) * 4;
        let end = end.min(b.buffer.size());
        let size = end - start;
        if size > self.limits.max_storage_buffer_binding_size {
            return Err(err(format!(
                "{} needs a {size}-byte binding; the adapter's largest is {}",
                t.desc(),
                self.limits.max_storage_buffer_binding_size
            )));
        }
        Ok(Bound {
            buffer: &b.buffer,
            start,
            size,
            byte_off: (t.offset() as u64 - start) as u32,
        })
    }

    /// Whether `t` can be bound whole.
    pub(crate) fn fits_binding(&self, nbytes: usize) -> bool {
        let align = self.limits.min_storage_buffer_offset_alignment.max(4) as u64;
        nbytes as u64 + align + 4 <= self.limits.max_storage_buffer_binding_size
    }

    /// `k`'s pipeline, and whether it reads the grid table at [`IQ_GRID_BINDING`].
    fn pipeline(&self, k: &Kernel) -> Result<(Arc<wgpu::ComputePipeline>, bool)> {
        if let Some(p) = self
            .pipelines
            .lock()
            .map_err(|_| err("pipeline cache poisoned"))?
            .get(k.entry)
        {
            return Ok(p.clone());
        }
        let source = k.source();
        let scope = push_scope(&self.device, wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(k.entry),
                source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
            });
        // An explicit layout with every binding the module declares, used or not by this
        // entry point, so launchers bind the same list for every entry of a family.
        let entries = binding_layout(k.entry, &source)?;
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(k.entry),
                entries: &entries,
            });
        let layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(k.entry),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(k.entry),
                layout: Some(&layout),
                module: &module,
                entry_point: Some(k.entry),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pop_scope(scope) {
            return Err(err(format!("kernel {}: {e}", k.entry)));
        }
        let grid = entries.iter().any(|e| e.binding == IQ_GRID_BINDING);
        let p = (Arc::new(pipeline), grid);
        self.pipelines
            .lock()
            .map_err(|_| err("pipeline cache poisoned"))?
            .insert(k.entry, p.clone());
        Ok(p)
    }

    /// Records one dispatch of `k` with the `bound` tensors at bindings `0..n` and `params`
    /// (u32 words, floats as their bits) at binding `n`.
    pub(crate) fn dispatch_bound(
        &self,
        k: &Kernel,
        bound: &[Bound<'_>],
        params: &[u32],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let max = self.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(err(format!(
                "kernel {}: grid {groups:?} exceeds the adapter's {max} workgroups per dimension",
                k.entry
            )));
        }
        let (pipeline, grid) = self.pipeline(k)?;
        let words: &[u32] = if params.is_empty() { &[0] } else { params };
        let (arena, at) = self.param_slot(bytemuck::cast_slice(words))?;
        let mut entries: Vec<wgpu::BindGroupEntry> = bound
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.buffer,
                    offset: b.start,
                    size: std::num::NonZeroU64::new(b.size),
                }),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: bound.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &arena,
                offset: at,
                size: std::num::NonZeroU64::new(4 * words.len() as u64),
            }),
        });
        if grid {
            let table = self.iq_grid.get_or_init(|| {
                self.device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("kiln i-quant grids"),
                        contents: bytemuck::cast_slice(&kiln_core::quant::iq_grid_words()),
                        usage: wgpu::BufferUsages::STORAGE,
                    })
            });
            entries.push(wgpu::BindGroupEntry {
                binding: IQ_GRID_BINDING,
                resource: table.as_entire_binding(),
            });
        }
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let submit = self.record_pass(|pass| {
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        })?;
        if submit {
            self.flush()?;
        }
        if let Some(profile) = &self.profile {
            // Profiling: wait for each dispatch and charge the time to its kernel.
            let t = kiln_core::time::Instant::now();
            self.wait()?;
            let us = t.elapsed().as_micros() as u64;
            if let Ok(mut p) = profile.lock() {
                let e = p.entry(k.entry).or_insert((0, 0));
                e.0 += 1;
                e.1 += us;
            }
        }
        Ok(())
    }

    /// Records a copy of `src`'s bytes into `dst` from byte `at` of `dst` on: both 4-byte
    /// aligned, and within `dst`.
    pub(crate) fn copy_into(&self, src: &Tensor, dst: &Tensor, at: usize) -> Result<()> {
        let (s0, s1, sb) = self.word_range(src)?;
        let db = self.buffer_of(dst)?;
        let d0 = (dst.offset() + at) as u64;
        if src.offset() % 4 != 0 || d0 % 4 != 0 || at + (s1 - s0) as usize > dst.nbytes() {
            return Err(err(format!(
                "cannot copy {} into {} at byte {at}",
                src.desc(),
                dst.desc()
            )));
        }
        self.record(|enc| enc.copy_buffer_to_buffer(sb, s0, &db.buffer, d0, s1 - s0))?;
        Ok(())
    }

    /// A scratch tensor on this device (for split reductions).
    pub(crate) fn scratch(&self, n_f32: usize) -> Result<Tensor> {
        self.alloc(&TensorDesc::new(
            kiln_core::tensor::DType::F32,
            [n_f32.max(1)],
        ))
    }
}

/// Splits `n` workgroups into a grid within the per-dimension limit: `(x, z)` with
/// `x * z >= n`; kernels rebuild the index as `wid.x + wid.z * x`.
pub(crate) fn fold(n: u32, max: u32) -> (u32, u32) {
    if n <= max {
        (n, 1)
    } else {
        let z = n.div_ceil(max);
        (n.div_ceil(z), z)
    }
}

/// The binding of `iquant.wgsl`'s grid table.
pub(crate) const IQ_GRID_BINDING: u32 = 15;

/// The storage bindings of group 0 that `source` declares, read-only or read-write.
fn binding_layout(entry: &str, source: &str) -> Result<Vec<wgpu::BindGroupLayoutEntry>> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| err(format!("kernel {entry}: {}", e.emit_to_string(source))))?;
    let mut out: Vec<wgpu::BindGroupLayoutEntry> = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let (Some(binding), naga::AddressSpace::Storage { access }) = (&var.binding, var.space)
        else {
            continue;
        };
        if binding.group != 0 || out.iter().any(|e| e.binding == binding.binding) {
            continue;
        }
        out.push(wgpu::BindGroupLayoutEntry {
            binding: binding.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage {
                    read_only: !access.contains(naga::StorageAccess::STORE),
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    out.sort_by_key(|e| e.binding);
    Ok(out)
}
