//! The CUDA kernels run on the CPU, for the tests: every file of `kernels/` is compiled by the
//! host C++ compiler against `emu/kiln_emu.h` (threads for CUDA threads, barriers for
//! `__syncthreads` and warp shuffles) and launched through the same [`plan`] and
//! [`check_launch`] as on a GPU, with arguments passed the way `cuLaunchKernel` takes them.
//! A backend over it runs the conformance suite against the CPU reference, so the kernels'
//! indexing and arithmetic and the launcher's grids and arguments are checked on a machine
//! without a GPU. What it cannot check is what only hardware shows: the memory model beyond
//! barriers, alignment faults, speed.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kiln_core::backend::{
    check_call, next_backend_id, Backend, Capabilities, DeviceKind, GraphId, SubmitStats,
};
use kiln_core::op::{Op, OpDesc};
use kiln_core::tensor::{BackendId, Storage, Tensor, TensorDesc};
use kiln_core::{Error, Result};

use crate::kernels::{self, Signature};
use crate::plan::{check_launch, plan, Arg, Step};

const HEADER: &str = include_str!("../emu/kiln_emu.h");

fn err(msg: impl Into<String>) -> Error {
    Error::backend("cuda-emu", msg)
}

/// The host C++ compiler: `KILN_CXX`, else `c++`.
fn compiler() -> String {
    std::env::var("KILN_CXX")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "c++".into())
}

/// Compiles every kernel file for the CPU into one shared library (cached by content).
pub fn build() -> std::result::Result<PathBuf, String> {
    build_with(None)
}

/// `build` with the tuning knobs of `spec` (as `KILN_CUDA_DEFINES` takes them) instead of
/// the environment's, where given.
pub fn build_with(spec: Option<&str>) -> std::result::Result<PathBuf, String> {
    let sigs = kernels::signatures()?;
    let mut units = Vec::new();
    for (file, _) in kernels::FILES {
        let src = kernels::source_with(file, spec).ok_or(format!("no file {file}"))?;
        // The CUDA headers are replaced by the emulation header.
        let mut text: String = src
            .lines()
            .filter(|l| !l.trim_start().starts_with("#include <cuda_"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut names: Vec<&String> = sigs
            .iter()
            .filter(|(_, s)| s.file == *file)
            .map(|(n, _)| n)
            .collect();
        names.sort();
        for n in names {
            text.push_str(&format!(
                "extern \"C\" void kiln_emu_{n}(const unsigned* dims, void** args) {{ kiln_emu::call(&{n}, dims, args); }}\n"
            ));
        }
        units.push((file.replace(".cu", ".cpp"), text));
    }
    let mut key = 0xcbf2_9ce4_8422_2325u64;
    for b in HEADER
        .bytes()
        .chain(units.iter().flat_map(|(n, t)| n.bytes().chain(t.bytes())))
        .chain(compiler().bytes())
    {
        key = (key ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let dir = std::env::temp_dir().join(format!("kiln-cuda-emu-{key:016x}"));
    let lib = dir.join("libkiln_cuda_emu.so");
    if lib.is_file() {
        return Ok(lib);
    }
    // Each build in a folder of its own, its library renamed into place at the end: tests
    // (threads, processes) that build the same library at once neither read each other's
    // half-written sources nor lose their output to the other's rename.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let work = dir.join(format!("build-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let built = compile_in(&work, &units)
        .and_then(|so| std::fs::rename(&so, &lib).map_err(|e| format!("{}: {e}", lib.display())));
    let _ = std::fs::remove_dir_all(&work);
    match built {
        Ok(()) => Ok(lib),
        // Another build got there first.
        Err(_) if lib.is_file() => Ok(lib),
        Err(e) => Err(e),
    }
}

/// Compiles the emulation header and `units` into a shared library in `work`; its path.
fn compile_in(
    work: &std::path::Path,
    units: &[(String, String)],
) -> std::result::Result<PathBuf, String> {
    std::fs::write(work.join("kiln_emu.h"), HEADER).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(compiler());
    cmd.current_dir(work).args([
        "-std=c++17",
        "-O1",
        "-fPIC",
        "-shared",
        "-pthread",
        "-w",
        // The fibers switch stacks with _longjmp, which a fortified libc would refuse.
        "-U_FORTIFY_SOURCE",
        "-include",
        "kiln_emu.h",
        "-o",
        "libkiln_cuda_emu.so",
    ]);
    for (name, text) in units {
        std::fs::write(work.join(name), text).map_err(|e| e.to_string())?;
        cmd.arg(name);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", compiler()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed on the kernels:\n{}",
            compiler(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(work.join("libkiln_cuda_emu.so"))
}

/// `__shared__` arrays are statics in the emulation, and every backend over the same kernel
/// library shares them (the library is loaded once a process): one launch at a time in the
/// whole process, not only per backend.
static EMU_LOCK: Mutex<()> = Mutex::new(());

/// Host memory standing in for a device buffer (8-byte aligned, as device memory is at least).
struct EmuBuf {
    data: UnsafeCell<Box<[u64]>>,
    len: usize,
    backend: BackendId,
}

// SAFETY: the buffer is only written by `upload` and by kernels, which the backend runs one at
// a time under EMU_LOCK; readers come after (the same ordering a CUDA stream gives).
unsafe impl Sync for EmuBuf {}

impl EmuBuf {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: see the `Sync` impl.
        unsafe { (*self.data.get()).as_mut_ptr() as *mut u8 }
    }
}

impl Storage for EmuBuf {
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

type Entry = unsafe extern "C" fn(*const u32, *mut *mut c_void);

/// One unit of work on the emulated device, its addresses resolved: what `execute` runs at
/// once, or records while capturing (as a CUDA graph's node keeps its arguments).
enum EmuOp {
    Launch {
        symbol: String,
        dims: [u32; 6],
        slots: Vec<u64>,
    },
    Copy {
        src: u64,
        dst: u64,
        bytes: usize,
    },
    /// Zeroes (a new tensor, as the CUDA backend's memset does) or fills with NaN (scratch).
    Fill {
        at: u64,
        bytes: usize,
        nan: bool,
    },
}

/// A step being recorded: its work, and every tensor it allocated (the graph's own).
#[derive(Default)]
struct EmuCapture {
    ops: Vec<EmuOp>,
    keep: Vec<Tensor>,
}

/// The kernels on the CPU behind the `Backend` trait, claiming exactly what the CUDA backend
/// claims.
pub struct EmuBackend {
    id: BackendId,
    caps: Capabilities,
    lib: libloading::Library,
    sigs: std::collections::HashMap<String, Signature>,
    /// Kernels launched so far (what `submit_stats` reports; the host time is not a GPU's).
    launches: std::sync::atomic::AtomicU64,
    capture: Mutex<Option<EmuCapture>>,
    graphs: Mutex<std::collections::HashMap<GraphId, EmuCapture>>,
    next_graph: std::sync::atomic::AtomicU64,
    /// The knobs the kernels were built with, where not the environment's: the launches are
    /// planned with the same.
    spec: Option<String>,
}

impl EmuBackend {
    pub fn open() -> std::result::Result<Arc<EmuBackend>, String> {
        Self::open_with(None)
    }

    /// The kernels built with the tuning knobs of `spec` (see [`build_with`]).
    pub fn open_with(spec: Option<&str>) -> std::result::Result<Arc<EmuBackend>, String> {
        let path = build_with(spec)?;
        // SAFETY: the library is the kernels compiled above; loading it runs no initialisers
        // beyond the C++ runtime's.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| e.to_string())?;
        Ok(Arc::new(EmuBackend {
            id: next_backend_id(),
            caps: Capabilities {
                device: "CUDA kernels emulated on the CPU".into(),
                kind: DeviceKind::Other,
                f16: true,
                bf16: true,
                subgroup_size: Some(32),
                max_buffer_bytes: u64::MAX,
                memory_bytes: None,
                parallelism: 1,
            },
            lib,
            sigs: kernels::signatures()?,
            launches: std::sync::atomic::AtomicU64::new(0),
            capture: Mutex::new(None),
            graphs: Mutex::new(std::collections::HashMap::new()),
            next_graph: std::sync::atomic::AtomicU64::new(1),
            spec: spec.map(str::to_string),
        }))
    }

    fn lock_capture(&self) -> std::sync::MutexGuard<'_, Option<EmuCapture>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_graphs(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<GraphId, EmuCapture>> {
        self.graphs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.lock_capture().is_some() {
            return Err(err(format!("{what} while a step is being recorded")));
        }
        Ok(())
    }

    /// A zero-filled buffer, recorded nowhere.
    fn new_buf(&self, desc: &TensorDesc) -> Result<Tensor> {
        let len = desc
            .nbytes()
            .ok_or_else(|| err(format!("{desc}: not whole blocks")))?;
        let buf = EmuBuf {
            data: UnsafeCell::new(vec![0u64; len.div_ceil(8).max(1)].into_boxed_slice()),
            len,
            backend: self.id,
        };
        Tensor::new(Arc::new(buf), 0, desc.clone())
    }

    /// Runs resolved work in order (the caller holds `EMU_LOCK`).
    fn run_ops(&self, ops: &[EmuOp]) -> Result<()> {
        for op in ops {
            match op {
                EmuOp::Fill { at, bytes, nan } => {
                    // SAFETY: the range is a live buffer of this backend (the tensor it came
                    // from is alive: an op's operands, or a graph's own tensors).
                    unsafe {
                        if *nan {
                            std::slice::from_raw_parts_mut(*at as *mut f32, bytes / 4)
                                .fill(f32::NAN)
                        } else {
                            std::ptr::write_bytes(*at as *mut u8, 0, *bytes)
                        }
                    }
                }
                EmuOp::Copy { src, dst, bytes } => {
                    // SAFETY: both ranges lie inside live buffers and do not overlap
                    // (`check_call`).
                    unsafe {
                        std::ptr::copy_nonoverlapping(*src as *const u8, *dst as *mut u8, *bytes)
                    }
                }
                EmuOp::Launch {
                    symbol,
                    dims,
                    slots,
                } => {
                    self.launches
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut slots = slots.clone();
                    let mut ptrs: Vec<*mut c_void> = slots
                        .iter_mut()
                        .map(|s| s as *mut u64 as *mut c_void)
                        .collect();
                    // SAFETY: the wrapper has this signature; the arguments match the kernel's
                    // parameters (`check_launch`) and point into live buffers.
                    unsafe {
                        let f: libloading::Symbol<Entry> = self
                            .lib
                            .get(symbol.as_bytes())
                            .map_err(|e| err(format!("{symbol}: {e}")))?;
                        f(dims.as_ptr(), ptrs.as_mut_ptr());
                    }
                }
            }
        }
        Ok(())
    }

    fn addr(&self, t: &Tensor) -> Result<u64> {
        let b = t
            .storage()
            .as_any()
            .downcast_ref::<EmuBuf>()
            .ok_or_else(|| err("not an emulator tensor"))?;
        Ok(b.ptr() as u64 + t.offset() as u64)
    }
}

impl Backend for EmuBackend {
    fn name(&self) -> &str {
        "cuda-emu"
    }
    fn id(&self) -> BackendId {
        self.id
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    fn alloc(&self, desc: &TensorDesc) -> Result<Tensor> {
        let t = self.new_buf(desc)?;
        if let Some(c) = self.lock_capture().as_mut() {
            // As on a GPU, the zeroing is part of the recorded step, and the tensor the graph's.
            c.ops.push(EmuOp::Fill {
                at: self.addr(&t)?,
                bytes: t.nbytes(),
                nan: false,
            });
            c.keep.push(t.clone());
        }
        Ok(t)
    }
    fn alloc_input(&self, desc: &TensorDesc) -> Result<Tensor> {
        let t = self.new_buf(desc)?;
        if let Some(c) = self.lock_capture().as_mut() {
            // Not zeroed on a GPU: filled with 0xff here, so a replay before the upload shows.
            // SAFETY: the new buffer holds `nbytes` and nothing else refers to it.
            unsafe { std::ptr::write_bytes(self.addr(&t)? as *mut u8, 0xff, t.nbytes()) };
            c.keep.push(t.clone());
        }
        Ok(t)
    }
    fn upload(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        self.refuse_while_capturing("an upload")?;
        if bytes.len() != dst.nbytes() {
            return Err(err("upload size"));
        }
        let _g = EMU_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the range is inside the buffer (`Tensor::new` checked it).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.addr(dst)? as *mut u8, bytes.len())
        };
        Ok(())
    }
    fn download(&self, src: &Tensor) -> Result<Vec<u8>> {
        self.refuse_while_capturing("a download")?;
        let mut out = vec![0u8; src.nbytes()];
        let _g = EMU_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: as in `upload`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.addr(src)? as *const u8, out.as_mut_ptr(), out.len())
        };
        Ok(out)
    }
    fn supports_op(&self, desc: &OpDesc) -> bool {
        kernels::with_knobs(self.spec.as_deref(), || plan(desc)).is_some()
    }
    fn execute(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        let desc = check_call(self, op, inputs, outputs)?;
        let steps = kernels::with_knobs(self.spec.as_deref(), || plan(&desc))
            .ok_or_else(|| err(format!("{desc} is not planned")))?;
        let scratch_descs = crate::plan::scratch_descs(&steps);
        let mut scratch: Vec<Tensor> = Vec::new();
        let mut ops: Vec<EmuOp> = Vec::new();
        for step in &steps {
            match step {
                Step::Scratch(desc) => {
                    // Uninitialised on a GPU: filled with NaN here, so a read before a write shows.
                    let t = self.new_buf(desc)?;
                    ops.push(EmuOp::Fill {
                        at: self.addr(&t)?,
                        bytes: t.nbytes(),
                        nan: true,
                    });
                    scratch.push(t);
                }
                Step::Copy { from, to } => ops.push(EmuOp::Copy {
                    src: self.addr(inputs[*from])?,
                    dst: self.addr(outputs[*to])?,
                    bytes: inputs[*from].nbytes(),
                }),
                Step::Launch(l) => {
                    let sig = self
                        .sigs
                        .get(l.kernel)
                        .ok_or_else(|| err(format!("no kernel {}", l.kernel)))?;
                    check_launch(sig, l, &desc.inputs, &desc.outputs, &scratch_descs)
                        .map_err(err)?;
                    // Each argument's value in its own 8-byte slot, as cuLaunchKernel reads
                    // them: pointers whole, 32-bit values in the low bytes.
                    let slots: Vec<u64> = l
                        .args
                        .iter()
                        .map(|a| {
                            Ok(match *a {
                                Arg::In(i) => self.addr(inputs[i])?,
                                Arg::Out(i) => self.addr(outputs[i])?,
                                Arg::Null => 0,
                                Arg::Scratch(i) => self.addr(&scratch[i])?,
                                Arg::U32(x) => x as u64,
                                Arg::I32(x) => x as u32 as u64,
                                Arg::F32(x) => x.to_bits() as u64,
                            })
                        })
                        .collect::<Result<_>>()?;
                    ops.push(EmuOp::Launch {
                        symbol: format!("kiln_emu_{}", l.kernel),
                        dims: [
                            l.grid.0, l.grid.1, l.grid.2, l.block.0, l.block.1, l.block.2,
                        ],
                        slots,
                    });
                }
            }
        }
        let mut cap = self.lock_capture();
        if let Some(c) = cap.as_mut() {
            // Recorded: the scratch tensors are the graph's from now on.
            c.keep.extend(scratch);
            c.ops.extend(ops);
            return Ok(());
        }
        drop(cap);
        let _g = EMU_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        self.run_ops(&ops)
    }
    fn synchronize(&self) -> Result<()> {
        self.refuse_while_capturing("a wait")
    }
    fn graphs(&self) -> bool {
        true
    }
    fn begin_capture(&self) -> Result<()> {
        let mut c = self.lock_capture();
        if c.is_some() {
            return Err(err("a step is already being recorded"));
        }
        *c = Some(EmuCapture::default());
        Ok(())
    }
    fn end_capture(&self) -> Result<GraphId> {
        let c = self
            .lock_capture()
            .take()
            .ok_or_else(|| err("no step is being recorded"))?;
        let id = self
            .next_graph
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock_graphs().insert(id, c);
        Ok(id)
    }
    fn abort_capture(&self) {
        self.lock_capture().take();
    }
    fn replay(&self, id: GraphId) -> Result<()> {
        self.refuse_while_capturing("a replay")?;
        let graphs = self.lock_graphs();
        let g = graphs
            .get(&id)
            .ok_or_else(|| err(format!("no graph {id}")))?;
        let _g = EMU_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        self.run_ops(&g.ops)
    }
    fn drop_graph(&self, id: GraphId) {
        self.lock_graphs().remove(&id);
    }
    /// The launches, counted as on a GPU (so launch counts per token are measured without
    /// one); no host time is reported, since the kernels run inside the call.
    fn submit_stats(&self) -> Option<SubmitStats> {
        Some(SubmitStats {
            launches: self.launches.load(std::sync::atomic::Ordering::Relaxed),
            host_seconds: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_core::cpu::CpuBackend;
    use kiln_core::validate::{run_all, tally, Status};

    fn required() -> bool {
        std::env::var("KILN_REQUIRE_CUDA_EMU").is_ok_and(|v| v == "1" || v == "true")
    }

    /// The whole conformance suite on the CUDA kernels, emulated, against the CPU reference.
    #[test]
    fn the_cuda_kernels_pass_the_conformance_suite_on_the_cpu() {
        conformance(None);
    }

    /// The same with the decode mat-vec staged through shared memory (MV_STAGED=1, not the
    /// default), so the kernels a tuning run may pick are checked too.
    #[test]
    fn the_staged_mat_vec_passes_the_conformance_suite_on_the_cpu() {
        conformance(Some("MV_STAGED=1,MV_X8=0"));
    }

    /// And with the lane-per-row mat-vec for every format it decodes (MV_STAGED=2: Q4_K, Q6_K,
    /// Q8_0 and the floats; the default, 3, takes it for the K-quants only).
    #[test]
    fn the_lane_per_row_mat_vec_passes_the_conformance_suite_on_the_cpu() {
        conformance(Some("MV_STAGED=2,MV_X8=0"));
    }

    /// And with the register ring for every format (MV_STAGED=0; the default keeps it for all
    /// but the K-quants).
    #[test]
    fn the_register_ring_mat_vec_passes_the_conformance_suite_on_the_cpu() {
        conformance(Some("MV_STAGED=0,MV_X8=0"));
    }

    /// And with the prefill tiles on the tensor cores (MM_TC=1: mma.sync over exact codes and
    /// activation parts, or over bf16 splits; the emulator computes each mma from PTX's
    /// fragment layouts), at 3 activation parts and at 2, with K split among blocks (what the
    /// suite's small matrices get) and not.
    #[test]
    fn the_tensor_core_prefill_tile_passes_the_conformance_suite_on_the_cpu() {
        conformance(Some("MM_TC=1"));
        conformance(Some("MM_TC=1,MM_PARTS=2,TC_SPLITS=1"));
    }

    /// And prefill attention over f16 caches on the tensor cores (FA_TC=1: f16 mma.sync over
    /// split queries and weights; the attention cases only, the rest of the suite being the
    /// default's).
    #[test]
    fn the_tensor_core_prefill_attention_passes_the_conformance_suite_on_the_cpu() {
        conformance_of(Some("FA_TC=1"), Some("attention"));
    }

    /// The tensor-core prefill attention (FA_TC=1) is as close to the CPU as the f32 FMA tile:
    /// queries and weights enter the mma as two f16 parts (to 2^-22 of each), the keys and
    /// values exactly, so only f32 sums round. A prompt of 300 rows after 200 cached keys, head
    /// dims 64 and 128, GQA groups of 4 and 1, random normal queries and caches.
    #[test]
    fn the_tensor_core_attention_is_as_accurate_as_the_fma_tile() {
        use kiln_core::op::{AttentionOp, AttnParams, Mask, Op};
        use kiln_core::tensor::DType;
        use kiln_core::validate::{run_case, Case, Input};
        let (Some(fma), Some(tc)) = (variant("FA_TC=0"), variant("FA_TC=1")) else {
            return;
        };
        let reference = CpuBackend::with_threads(1);
        let (bs, len, rows) = (16usize, 500usize, 300usize);
        let nb = len / bs + 2;
        for (hq, hkv, d) in [(8usize, 2usize, 128usize), (4, 4, 64)] {
            // The sequence's blocks in reverse order through the pool.
            let table: Vec<i32> = (0..len.div_ceil(bs)).map(|b| (nb - 1 - b) as i32).collect();
            let mut case = Case::new(
                Op::Attention(AttentionOp::PagedAttention(AttnParams {
                    scale: 1.0 / (d as f32).sqrt(),
                    soft_cap: None,
                    mask: Mask::Causal,
                })),
                format!("prefill {rows} rows at {len}, Hq={hq} Hkv={hkv} D={d}"),
                vec![
                    Input::normal(DType::F32, &[rows, hq, d]),
                    Input::normal(DType::F16, &[nb, bs, hkv, d]),
                    Input::normal(DType::F16, &[nb, bs, hkv, d]),
                    Input::ints(&[1, table.len()], table.clone()),
                    Input::ints(&[1], vec![len as i32]),
                    Input::ints(&[2], vec![0, rows as i32]),
                ],
            )
            .expect("case");
            case.tol = Some(1.0);
            let nmse = |b: &dyn Backend| {
                let r = run_case(&case, &reference, b, false);
                r.nmse
                    .unwrap_or_else(|| panic!("{}: {:?}", case.label, r.status))
            };
            let (a, b) = (nmse(fma.as_ref()), nmse(tc.as_ref()));
            println!(
                "{}: NMSE against the CPU, FMA tile {a:.2e}, tensor cores {b:.2e}",
                case.label
            );
            assert!(
                b <= 1e-12 && b <= 16.0 * a.max(1e-15),
                "{}: the tensor-core kernel is {b:.2e} from the CPU, the FMA tile {a:.2e}",
                case.label
            );
        }
    }

    /// The codes tile (MM_TC=1 for Q8_0, Q4_0, Q4_1, Q4_K, Q6_K and bf16 weights) multiplies
    /// exactly (integer codes and exact bf16 parts of the activations), so against the CPU
    /// reference it is as close as the f32 FMA tile is (two f32 summation orders: NMSE
    /// 1e-13..2e-12 on rows of 4096, random normal values). The split tile it replaces for
    /// these formats (two bf16 parts a value, three products: exact to 2^-14 of each product)
    /// was 1.6e-11 from the CPU on the Q8_0 case.
    #[test]
    fn the_codes_tile_is_as_accurate_as_the_fma_tile() {
        use kiln_core::op::{MatMulOp, Op};
        use kiln_core::tensor::DType;
        use kiln_core::validate::{run_case, Case, Input};
        let (Some(fma), Some(tc)) = (variant("MM_TC=0"), variant("MM_TC=1")) else {
            return;
        };
        let reference = CpuBackend::with_threads(1);
        let k = 4096;
        for w in [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q4_K,
            DType::Q6_K,
            DType::BF16,
        ] {
            let mut case = Case::new(
                Op::MatMul(MatMulOp::MatMul),
                format!("f32 x {w} prefill m=40 k={k} n=70"),
                vec![
                    Input::normal(DType::F32, &[40, k]),
                    Input::normal(w, &[70, k]),
                ],
            )
            .expect("case");
            case.tol = Some(1.0);
            let nmse = |b: &dyn Backend| {
                let r = run_case(&case, &reference, b, false);
                r.nmse.unwrap_or_else(|| panic!("{w}: {:?}", r.status))
            };
            let (a, b) = (nmse(fma.as_ref()), nmse(tc.as_ref()));
            println!("{w}: NMSE against the CPU, FMA tile {a:.2e}, codes tile {b:.2e}");
            assert!(
                b <= 1e-12 && b <= 16.0 * a.max(1e-15),
                "{w}: the codes tile is {b:.2e} from the CPU, the FMA tile {a:.2e}"
            );
        }
    }

    /// And the decode mat-vec over int8 activation parts (quantize_x8, then mat_vec_x8_<fmt>;
    /// the default, at 3 parts a value and 8 rows a block, runs in the first test) at 2 parts
    /// (a bound of a / 64516 a value, inside the suite's tolerance) and 3 rows; its staged
    /// kernel at its defaults and with one row a warp and two steps in flight; and the f32
    /// kernels it replaced for Q4_K (MV_X8=0).
    #[test]
    fn the_int8_activation_mat_vec_passes_the_conformance_suite_on_the_cpu() {
        conformance(Some("MV_X8=0"));
        conformance(Some("MV_X8=1,MVX_PARTS=2,MVX_ROWS=3"));
        conformance(Some("MV_X8=1,MVX_SPLIT=0"));
        conformance(Some("MV_X8=1,MVX_SPLIT=0,MVX_ROWS=1,MVX_STAGES=2"));
    }

    /// And its tensor-core form (one mma.m16n8k32 over 16 rows a group; the emulator computes
    /// the mma from PTX's fragment layout) at its defaults (2 blocks in flight a warp), and at 2
    /// parts with 3 warps a block and one block in flight.
    #[test]
    fn the_tensor_core_int8_mat_vec_passes_the_conformance_suite_on_the_cpu() {
        conformance(Some("MVX_MMA=1"));
        conformance(Some("MVX_MMA=1,MVX_PARTS=2,MVX_WARPS=3,MVX_DEPTH=1"));
    }

    /// The emulated kernels built with the knobs of `spec`, or `None` (skipping) where the
    /// host compiler cannot build them and KILN_REQUIRE_CUDA_EMU is not set.
    fn variant(spec: &str) -> Option<Arc<EmuBackend>> {
        match EmuBackend::open_with(Some(spec)) {
            Ok(b) => Some(b),
            Err(e) => {
                assert!(!required(), "KILN_REQUIRE_CUDA_EMU is set: {e}");
                println!("skipping the emulated CUDA kernels: {e}");
                None
            }
        }
    }

    fn conformance(spec: Option<&str>) {
        conformance_of(spec, None)
    }

    /// The conformance suite's cases whose op or label contains `filter` (all without one).
    fn conformance_of(spec: Option<&str>, filter: Option<&str>) {
        let emu = match EmuBackend::open_with(spec) {
            Ok(b) => b,
            Err(e) => {
                assert!(!required(), "KILN_REQUIRE_CUDA_EMU is set: {e}");
                println!("skipping the emulated CUDA kernels: {e}");
                return;
            }
        };
        let reference = CpuBackend::with_threads(1);
        let results = run_all(filter, &reference, emu.as_ref(), false, |_| {}).expect("cases");
        let (pass, fail, unsupported) = tally(&results);
        for r in &results {
            if let Status::Fail(m) = &r.status {
                eprintln!("FAIL {} {}: {m}", r.op, r.case);
            }
        }
        println!(
            "cuda kernels (emulated{}): {pass} passed, {fail} failed, {unsupported} not supported",
            spec.map(|s| format!(", {s}")).unwrap_or_default()
        );
        let mut left: Vec<String> = results
            .iter()
            .filter(|r| r.status == Status::NotSupported)
            .map(|r| format!("{} {}", r.op, r.case))
            .collect();
        left.sort();
        println!("not claimed by the CUDA backend:\n  {}", left.join("\n  "));
        assert_eq!(
            fail, 0,
            "emulated CUDA kernels disagree with the CPU reference"
        );
        // The decode path of every supported model runs on the kernels.
        for op in [
            "mat_mul",
            "get_rows",
            "rms_norm",
            "rope",
            "paged_attention",
            "kv_write",
            "swiglu",
            "geglu",
            "add",
            "mul",
            "softmax",
            "delta_net_decode",
            "conv1d_decode",
            "moe_route",
            "mat_mul_id",
            "moe_sum",
            "l2_norm",
            "cast",
            "argmax",
        ] {
            assert!(
                filter.is_some_and(|f| !op.contains(f))
                    || results
                        .iter()
                        .any(|r| r.op == op && r.status == Status::Pass),
                "no case of {op} ran on the kernels"
            );
        }
    }
}
