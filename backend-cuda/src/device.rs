//! The device: one CUDA context and stream, the caching allocator, the kernels compiled by
//! NVRTC for this device's exact architecture (through the on-disk cubin cache), and launches.
//!
//! Everything runs in order on one stream, so tensors need no events: an upload, a kernel and
//! a download enqueued one after another see each other's results, and a block the allocator
//! hands out again is only touched by work enqueued after its last reader.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::sys::CUgraphInstantiate_flags as InstantiateFlags;
use cudarc::driver::sys::CUstreamCaptureMode as CaptureMode;
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaGraph, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use kiln_core::backend::{next_backend_id, Capabilities, DeviceKind, GraphId, SubmitStats};
use kiln_core::tensor::{BackendId, Storage, Tensor, TensorDesc};
use kiln_core::{Error, Result};

use crate::kernels::{self, Signature};
use crate::nvrtc::{Nvrtc, Toolchain};
use crate::plan::{check_launch, Arg, Launch, Step};
use crate::pool::{Pool, RawAlloc};

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::backend("cuda", msg)
}

fn driver_err(what: &str, e: impl std::fmt::Debug) -> Error {
    err(format!("{what}: {e:?}"))
}

/// The architecture NVRTC compiles for on a device of compute capability `cc`: the
/// arch-specific target (`a`) where kiln uses its features (Hopper, Blackwell), else the
/// plain one.
pub fn arch_for(cc: (i32, i32)) -> String {
    match cc {
        (9, 0) | (10, 0) | (10, 3) | (12, 0) | (12, 1) => format!("sm_{}{}a", cc.0, cc.1),
        (major, minor) => format!("sm_{major}{minor}"),
    }
}

/// Where compiled cubins are kept: `KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else
/// `~/.cache/kiln`; `cuda/` inside it.
fn cache_dir() -> Option<PathBuf> {
    let env = |v: &str| {
        std::env::var_os(v)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    };
    let base = env("KILN_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("kiln")))
        .or_else(|| env("HOME").map(|p| p.join(".cache").join("kiln")))?;
    Some(base.join("cuda"))
}

/// `cuMemAlloc`/`cuMemFree` under the pool.
pub(crate) struct DriverAlloc {
    ctx: Arc<CudaContext>,
}

impl RawAlloc for DriverAlloc {
    fn alloc(&self, bytes: usize) -> std::result::Result<u64, String> {
        self.ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
        // SAFETY: a plain device allocation in the bound context.
        unsafe { result::malloc_sync(bytes) }.map_err(|e| format!("cuMemAlloc({bytes}): {e:?}"))
    }
    fn free(&self, ptr: u64, _bytes: usize) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `alloc` and no tensor refers to it any more (the pool
            // only frees blocks in its free lists).
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
    fn is_oom(&self, err: &str) -> bool {
        err.contains("OUT_OF_MEMORY")
    }
}

/// A device allocation; back to the pool when the last tensor on it is dropped.
pub(crate) struct Buffer {
    ptr: u64,
    len: usize,
    class: usize,
    backend: BackendId,
    pool: Arc<Pool<DriverAlloc>>,
}

impl Storage for Buffer {
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

impl Drop for Buffer {
    fn drop(&mut self) {
        self.pool.free(self.ptr, self.class);
    }
}

pub(crate) struct Gpu {
    pub id: BackendId,
    pub caps: Capabilities,
    pub arch: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: Arc<Pool<DriverAlloc>>,
    sigs: HashMap<String, Signature>,
    functions: HashMap<String, CudaFunction>,
    /// The kernels started with programmatic dependent launch (`// @pdl` in their files; on
    /// sm_90 and later, unless `KILN_CUDA_DEFINES` has `PDL=0`).
    pdl: std::collections::HashSet<String>,
    /// Cleared when a programmatic launch fails outside a recording: later launches are plain.
    pdl_ok: std::sync::atomic::AtomicBool,
    /// Launches and copies enqueued, and nanoseconds of host time `execute` took.
    launches: AtomicU64,
    submit_ns: AtomicU64,
    /// While a step is being recorded (the stream is capturing): every tensor allocated
    /// meanwhile, which the graph keeps.
    capture: Mutex<Option<Capturing>>,
    graphs: Mutex<HashMap<GraphId, Recorded>>,
    next_graph: AtomicU64,
}

/// A recording in progress: the thread recording (the stream is shared: work another thread
/// submitted meanwhile would land in the graph, so it is refused) and the tensors kept.
struct Capturing {
    thread: std::thread::ThreadId,
    keep: Vec<Tensor>,
}

/// One kernel argument's value.
enum V {
    P(u64),
    U(u32),
    I(i32),
    F(f32),
}

/// A graph and the memory its launches use.
struct Recorded {
    graph: SendGraph,
    _keep: Vec<Tensor>,
}

/// cudarc's graph is not `Send`: its handles are only used under the `graphs` lock, one
/// call at a time, and the context is bound on whichever thread makes the call.
struct SendGraph(CudaGraph);
// SAFETY: see above; CUDA graph objects may be used from any thread when calls on one are
// serialised, which the mutex around every `Recorded` does.
unsafe impl Send for SendGraph {}

impl Gpu {
    /// Opens device `ordinal`, compiles every kernel file for its architecture (in parallel,
    /// through the disk cache) and loads them.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let na = |what: &str, e: &dyn std::fmt::Debug| {
            Error::NotAvailable(format!("cuda: {what}: {e:?}"))
        };
        let tc = Toolchain::find()?;
        let nvrtc = Nvrtc::load(&tc.nvrtc)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| na(&format!("device {ordinal}"), &e))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| na("compute capability", &e))?;
        let arch = arch_for(cc);
        let name = ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let total = ctx.total_mem().ok().map(|b| b as u64);
        let sms = ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1)
            .max(1) as usize;
        let stream = ctx.new_stream().map_err(|e| na("stream", &e))?;
        let sigs = kernels::signatures().map_err(err)?;

        // Compile (or read from the cache) every file at once: NVRTC is single-threaded per
        // program and a cold cache otherwise costs a minute.
        let dir = cache_dir();
        let compiled: Vec<(&'static str, Result<Vec<u8>>)> = std::thread::scope(|s| {
            let handles: Vec<_> = kernels::FILES
                .iter()
                .map(|(file, _)| {
                    let (tc, nvrtc, arch, dir) = (&tc, &nvrtc, &arch, &dir);
                    (
                        *file,
                        s.spawn(move || -> Result<Vec<u8>> {
                            let src = kernels::source(file)
                                .ok_or_else(|| err(format!("no kernel file {file}")))?;
                            match dir {
                                Some(d) => nvrtc.compile_cached(tc, d, file, &src, arch),
                                None => Ok(nvrtc.compile(tc, file, &src, arch)?.cubin),
                            }
                        }),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(f, h)| {
                    (
                        f,
                        h.join()
                            .unwrap_or_else(|_| Err(err(format!("compiling {f} panicked")))),
                    )
                })
                .collect()
        });
        let mut functions = HashMap::new();
        for (file, cubin) in compiled {
            let module = ctx
                .load_module(Ptx::from_binary(cubin?))
                .map_err(|e| driver_err(&format!("loading {file} for {arch}"), e))?;
            for (kname, sig) in &sigs {
                if sig.file == file {
                    let f = module
                        .load_function(kname)
                        .map_err(|e| driver_err(&format!("{file}: kernel {kname}"), e))?;
                    functions.insert(kname.clone(), f);
                }
            }
        }
        let caps = Capabilities {
            device: format!("{name} ({arch})"),
            kind: DeviceKind::DiscreteGpu,
            f16: true,
            bf16: cc.0 >= 8,
            subgroup_size: Some(32),
            max_buffer_bytes: total.unwrap_or(u64::MAX),
            memory_bytes: total,
            parallelism: sms,
        };
        let pool = Arc::new(Pool::new(DriverAlloc { ctx: ctx.clone() }));
        // Programmatic edges in captured graphs need a CUDA 12.3 driver or newer.
        let mut driver = 0i32;
        // SAFETY: writes one int; the driver library is loaded (the context exists).
        let driver_ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
            .result()
            .is_ok()
            && driver >= 12030;
        let pdl = if cc.0 >= 9 && driver_ok && kernels::knob("PDL") != Some(0) {
            kernels::pdl_kernels().into_iter().collect()
        } else {
            Default::default()
        };
        Ok(Gpu {
            id: next_backend_id(),
            caps,
            arch,
            ctx,
            stream,
            pool,
            sigs,
            functions,
            pdl,
            pdl_ok: std::sync::atomic::AtomicBool::new(true),
            launches: AtomicU64::new(0),
            submit_ns: AtomicU64::new(0),
            capture: Mutex::new(None),
            graphs: Mutex::new(HashMap::new()),
            next_graph: AtomicU64::new(1),
        })
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }

    fn buffer<'t>(&self, t: &'t Tensor) -> Result<&'t Buffer> {
        let b = t
            .storage()
            .as_any()
            .downcast_ref::<Buffer>()
            .ok_or_else(|| err(format!("{t:?} is not a CUDA tensor")))?;
        if b.backend != self.id {
            return Err(err(format!("{t:?} belongs to another CUDA backend")));
        }
        Ok(b)
    }

    /// The device address of a tensor's first byte.
    fn addr(&self, t: &Tensor) -> Result<u64> {
        Ok(self.buffer(t)?.ptr + t.offset() as u64)
    }

    fn lock_capture(&self) -> std::sync::MutexGuard<'_, Option<Capturing>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses work from another thread than the one recording a step; keeps `t` (a new
    /// tensor) in the graph while recording.
    fn note_alloc(&self, t: &Tensor) -> Result<()> {
        self.check_recorder()?;
        if let Some(c) = self.lock_capture().as_mut() {
            c.keep.push(t.clone());
        }
        Ok(())
    }

    fn check_recorder(&self) -> Result<()> {
        match self.lock_capture().as_ref() {
            Some(c) if c.thread != std::thread::current().id() => Err(err(
                "another thread is recording a step on this device's stream",
            )),
            _ => Ok(()),
        }
    }

    fn lock_graphs(&self) -> std::sync::MutexGuard<'_, HashMap<GraphId, Recorded>> {
        self.graphs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.lock_capture().is_some() {
            return Err(err(format!("{what} while a step is being recorded")));
        }
        Ok(())
    }

    pub fn alloc(&self, desc: &TensorDesc) -> Result<Tensor> {
        let t = self.alloc_raw(desc)?;
        self.note_alloc(&t)?;
        if t.nbytes() > 0 {
            self.bind()?;
            // SAFETY: the tensor's range lies inside its buffer; the memset is ordered on our
            // stream (recorded into the graph while capturing).
            unsafe {
                result::memset_d8_async(self.addr(&t)?, 0, t.nbytes(), self.stream.cu_stream())
            }
            .map_err(|e| driver_err("zeroing a new tensor", e))?;
        }
        Ok(t)
    }

    /// A tensor not zero-filled, for a step input the caller fills before each replay.
    pub fn alloc_input(&self, desc: &TensorDesc) -> Result<Tensor> {
        let t = self.alloc_raw(desc)?;
        self.note_alloc(&t)?;
        Ok(t)
    }

    /// Starts recording: the stream captures (relaxed, so the allocator may still call
    /// cuMemAlloc) and every tensor allocated until the end is kept by the graph.
    pub fn begin_capture(&self) -> Result<()> {
        let mut c = self.lock_capture();
        if c.is_some() {
            return Err(err("a step is already being recorded"));
        }
        self.stream
            .begin_capture(CaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| driver_err("beginning a stream capture", e))?;
        *c = Some(Capturing {
            thread: std::thread::current().id(),
            keep: Vec::new(),
        });
        Ok(())
    }

    pub fn end_capture(&self) -> Result<GraphId> {
        self.check_recorder()?;
        let keep = self
            .lock_capture()
            .take()
            .ok_or_else(|| err("no step is being recorded"))?
            .keep;
        let graph = self
            .stream
            .end_capture(InstantiateFlags(0))
            .map_err(|e| driver_err("ending the stream capture", e))?
            .ok_or_else(|| err("the stream capture recorded no graph"))?;
        // The first launch then does not pay for moving the graph to the device.
        graph
            .upload()
            .map_err(|e| driver_err("uploading a graph", e))?;
        let id = self.next_graph.fetch_add(1, Ordering::Relaxed);
        self.lock_graphs().insert(
            id,
            Recorded {
                graph: SendGraph(graph),
                _keep: keep,
            },
        );
        Ok(id)
    }

    pub fn abort_capture(&self) {
        if self.lock_capture().take().is_some() {
            // Ends the capture; whatever it recorded is destroyed with the graph.
            let _ = self.stream.end_capture(InstantiateFlags(0));
        }
    }

    pub fn replay(&self, id: GraphId) -> Result<()> {
        self.refuse_while_capturing("a replay")?;
        let t0 = std::time::Instant::now();
        let graphs = self.lock_graphs();
        let g = graphs
            .get(&id)
            .ok_or_else(|| err(format!("no graph {id}")))?;
        g.graph
            .0
            .launch()
            .map_err(|e| driver_err("launching a graph", e))?;
        self.count(1, t0.elapsed());
        Ok(())
    }

    /// Frees a graph. Its memory goes back to the pool: work enqueued later on the stream,
    /// the only one that may reuse it, runs after the graph's last launch.
    pub fn drop_graph(&self, id: GraphId) {
        self.lock_graphs().remove(&id);
    }

    fn alloc_raw(&self, desc: &TensorDesc) -> Result<Tensor> {
        let nbytes = desc
            .nbytes()
            .ok_or_else(|| err(format!("{desc}: not a whole number of blocks")))?;
        let (ptr, class) = self.pool.alloc(nbytes).map_err(|e| {
            let s = self.pool.stats();
            err(format!(
                "allocating {desc} ({nbytes} bytes): {e} ({} MiB live in tensors)",
                s.live_bytes >> 20
            ))
        })?;
        let buf = Buffer {
            ptr,
            len: nbytes,
            class,
            backend: self.id,
            pool: self.pool.clone(),
        };
        Tensor::new(Arc::new(buf), 0, desc.clone())
    }

    pub fn upload(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        self.refuse_while_capturing("an upload")?;
        if bytes.len() != dst.nbytes() {
            return Err(err(format!(
                "upload of {} bytes into {dst:?} ({} bytes)",
                bytes.len(),
                dst.nbytes()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let at = self.addr(dst)?;
        self.bind()?;
        // SAFETY: the range lies inside the tensor's buffer (checked by `Tensor::new`). From
        // pageable host memory the call returns once the bytes are staged, so `bytes` may go.
        unsafe { result::memcpy_htod_async(at, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver_err("upload", e))?;
        // An upload is submitted work like a launch (a decode step's inputs are a few).
        self.count(1, t0.elapsed());
        Ok(())
    }

    pub fn download(&self, src: &Tensor) -> Result<Vec<u8>> {
        self.refuse_while_capturing("a download")?;
        let mut out = vec![0u8; src.nbytes()];
        if out.is_empty() {
            return Ok(out);
        }
        let at = self.addr(src)?;
        self.bind()?;
        // SAFETY: as in `upload`; the stream is synchronised before `out` is read.
        unsafe { result::memcpy_dtoh_async(&mut out, at, self.stream.cu_stream()) }
            .map_err(|e| driver_err("download", e))?;
        self.wait()?;
        Ok(out)
    }

    /// Counts one op's launches and copies and the host time it took to enqueue them.
    pub fn count_submit(&self, steps: &[Step], took: std::time::Duration) {
        let n = steps
            .iter()
            .filter(|s| !matches!(s, Step::Scratch(_)))
            .count() as u64;
        self.count(n, took);
    }

    /// Counts `n` launches or copies submitted in `took` of host time.
    fn count(&self, n: u64, took: std::time::Duration) {
        self.launches.fetch_add(n, Ordering::Relaxed);
        self.submit_ns.fetch_add(
            took.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    pub fn submit_stats(&self) -> SubmitStats {
        SubmitStats {
            launches: self.launches.load(Ordering::Relaxed),
            host_seconds: self.submit_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    pub fn wait(&self) -> Result<()> {
        self.refuse_while_capturing("a wait")?;
        self.stream
            .synchronize()
            .map_err(|e| driver_err("synchronize", e))
    }

    /// Enqueues the steps of one op. Its scratch tensors go back to the pool when it returns:
    /// work enqueued later on the stream, the only one that may reuse them, runs after the
    /// op's kernels.
    pub fn run(&self, steps: &[Step], ins: &[&Tensor], outs: &[&Tensor]) -> Result<()> {
        self.check_recorder()?;
        let mut scratch: Vec<Tensor> = Vec::new();
        // The operands' descriptions, for every launch's check (borrowed, not cloned).
        let in_descs: Vec<&TensorDesc> = ins.iter().map(|t| t.desc()).collect();
        let out_descs: Vec<&TensorDesc> = outs.iter().map(|t| t.desc()).collect();
        for step in steps {
            match step {
                Step::Scratch(desc) => scratch.push(self.alloc(desc)?),
                Step::Launch(l) => {
                    let descs = (&in_descs[..], &out_descs[..]);
                    self.launch(l, ins, outs, &scratch, descs)?
                }
                Step::Copy { from, to } => {
                    let (src, dst) = (ins[*from], outs[*to]);
                    let n = src.nbytes().min(dst.nbytes());
                    if n == 0 {
                        continue;
                    }
                    let (s, d) = (self.addr(src)?, self.addr(dst)?);
                    self.bind()?;
                    // SAFETY: both ranges lie inside their buffers; ordered on our stream.
                    unsafe { result::memcpy_dtod_async(d, s, n, self.stream.cu_stream()) }
                        .map_err(|e| driver_err("copy", e))?;
                }
            }
        }
        Ok(())
    }

    fn launch(
        &self,
        l: &Launch,
        ins: &[&Tensor],
        outs: &[&Tensor],
        scratch: &[Tensor],
        (in_descs, out_descs): (&[&TensorDesc], &[&TensorDesc]),
    ) -> Result<()> {
        let sig = self
            .sigs
            .get(l.kernel)
            .ok_or_else(|| err(format!("no kernel named {}", l.kernel)))?;
        let scratch_descs: Vec<&TensorDesc> = scratch.iter().map(|t| t.desc()).collect();
        check_launch(sig, l, in_descs, out_descs, &scratch_descs).map_err(err)?;
        let f = self
            .functions
            .get(l.kernel)
            .ok_or_else(|| err(format!("kernel {} is not loaded", l.kernel)))?;
        let vals = l
            .args
            .iter()
            .map(|a| {
                Ok(match *a {
                    Arg::In(i) => V::P(self.addr(ins[i])?),
                    Arg::Out(i) => V::P(self.addr(outs[i])?),
                    Arg::Null => V::P(0),
                    Arg::Scratch(i) => V::P(self.addr(&scratch[i])?),
                    Arg::U32(x) => V::U(x),
                    Arg::I32(x) => V::I(x),
                    Arg::F32(x) => V::F(x),
                })
            })
            .collect::<Result<Vec<V>>>()?;
        if self.pdl.contains(l.kernel) && self.pdl_ok.load(Ordering::Relaxed) {
            match self.launch_pdl(f, l, &vals) {
                Ok(()) => return Ok(()),
                // Not while a step is being recorded: the capture may already be spoiled, and
                // the executor turns recording off on the error.
                Err(e) if self.lock_capture().is_some() => return Err(e),
                Err(e) => {
                    tracing::warn!("{e}; launching every kernel after the one before from now on");
                    self.pdl_ok.store(false, Ordering::Relaxed);
                }
            }
        }
        let mut b = self.stream.launch_builder(f);
        for v in &vals {
            match v {
                V::P(p) => b.arg(p),
                V::U(x) => b.arg(x),
                V::I(x) => b.arg(x),
                V::F(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameters in count, kind and element type
        // (`check_launch`), every pointer is a live tensor of this backend, and the plan keeps
        // every index the kernel computes inside the tensors' shapes.
        unsafe { b.launch(cfg) }.map_err(|e| driver_err(&format!("launching {}", l.kernel), e))?;
        Ok(())
    }

    /// `l` started with programmatic dependent launch: it may begin while the kernel before
    /// it runs, and waits for it inside (`grid_wait`, which every `// @pdl` kernel calls before
    /// it reads what earlier kernels wrote or writes anything). Captured into graphs as a
    /// programmatic edge.
    fn launch_pdl(&self, f: &CudaFunction, l: &Launch, vals: &[V]) -> Result<()> {
        use cudarc::driver::sys;
        let mut params: Vec<*mut std::ffi::c_void> = vals
            .iter()
            .map(|v| match v {
                V::P(p) => p as *const u64 as *mut std::ffi::c_void,
                V::U(x) => x as *const u32 as *mut std::ffi::c_void,
                V::I(x) => x as *const i32 as *mut std::ffi::c_void,
                V::F(x) => x as *const f32 as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: a plain-old-data C struct; zero is a valid value of every field.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: l.grid.0,
            gridDimY: l.grid.1,
            gridDimZ: l.grid.2,
            blockDimX: l.block.0,
            blockDimY: l.block.1,
            blockDimZ: l.block.2,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        self.bind()?;
        // SAFETY: as in `launch`: the arguments match the kernel's parameters (`check_launch`),
        // each parameter pointer points at a value alive for the call, every tensor pointer is
        // a live tensor of this backend; `cfg` and `attr` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| {
            driver_err(
                &format!("launching {} (programmatic dependent launch)", l.kernel),
                e,
            )
        })
    }
}
