//! The `Backend` trait and what a backend says it can do. The executor (in `exec`) is the
//! one dispatcher over it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::op::{Op, OpDesc};
use crate::tensor::{BackendId, Tensor, TensorDesc};

/// What kind of device runs a backend.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    IntegratedGpu,
    DiscreteGpu,
    VirtualGpu,
    /// A software rasteriser or emulator (e.g. lavapipe): correct, not fast.
    SoftwareGpu,
    Other,
}

/// A backend's device and features. `supports_op` is the authority on ops; this is what
/// `kiln info` prints and what a backend consults to answer it.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// Device name as the driver reports it.
    pub device: String,
    pub kind: DeviceKind,
    /// Native f16 arithmetic in kernels.
    pub f16: bool,
    /// Native bf16 arithmetic in kernels.
    pub bf16: bool,
    /// Subgroup (warp) operations, with the subgroup size when known.
    pub subgroup_size: Option<u32>,
    /// The largest single buffer (or storage binding) the backend can address, in bytes.
    pub max_buffer_bytes: u64,
    /// Device memory, when known.
    pub memory_bytes: Option<u64>,
    /// Worker threads (CPU) or compute units (GPU), when known.
    pub parallelism: usize,
}

/// A future that stays on its thread (on the web, GPU objects do).
pub type LocalFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

/// One implementation of the op set. Tensors belong to the backend that allocated them.
///
/// `execute` may be asynchronous on a device: results are visible to `download` (which waits)
/// and after `synchronize`.
pub trait Backend: Send + Sync {
    /// Short name: `cpu`, `wgpu`, `cuda`.
    fn name(&self) -> &str;
    /// Unique per backend instance; tensors carry it.
    fn id(&self) -> BackendId;
    fn capabilities(&self) -> &Capabilities;
    /// A new tensor, zero-filled.
    fn alloc(&self, desc: &TensorDesc) -> Result<Tensor>;
    /// Writes `bytes` (exactly `dst.nbytes()` of them) into `dst`.
    fn upload(&self, dst: &Tensor, bytes: &[u8]) -> Result<()>;
    /// Reads `src` back to the host.
    fn download(&self, src: &Tensor) -> Result<Vec<u8>>;
    /// `download` without blocking the thread: in a browser a GPU buffer can be read only
    /// after control returns to the event loop, so code that runs there awaits this instead.
    /// The default is `download`, ready at once.
    fn download_async<'a>(&'a self, src: &'a Tensor) -> LocalFuture<'a, Result<Vec<u8>>> {
        Box::pin(std::future::ready(self.download(src)))
    }
    /// Whether this backend runs `desc` exactly (its dtypes, shapes and parameters) and
    /// passes the conformance suite for it. A false "yes" is a correctness bug.
    fn supports_op(&self, desc: &OpDesc) -> bool;
    /// Runs `op`. Callers go through the [`Executor`], which checks the call first.
    fn execute(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()>;
    /// Waits until every submitted op has finished.
    fn synchronize(&self) -> Result<()>;
    /// Kernel launches and host time spent submitting ops since the backend opened, where
    /// the backend counts them (the asynchronous device backends do).
    fn submit_stats(&self) -> Option<SubmitStats> {
        None
    }

    /// Whether this backend records ops into graphs it can replay (CUDA graphs): what
    /// [`begin_capture`](Backend::begin_capture) and the rest need. A backend without them
    /// runs every op as it comes.
    fn graphs(&self) -> bool {
        false
    }
    /// Starts recording. Until `end_capture` or `abort_capture`, `execute` records its work
    /// instead of running it, every tensor allocated is the graph's own (its memory stays
    /// with the graph, so a replay never writes over a later tensor), and `upload` and
    /// `download` are refused (a recorded step reads its inputs from tensors the caller fills
    /// before each replay: see [`alloc_input`](Backend::alloc_input)).
    fn begin_capture(&self) -> Result<()> {
        Err(no_graphs(self.name()))
    }
    /// A tensor, not zero-filled, that the caller fills with `upload` before every replay
    /// (while capturing: owned by the graph like every other allocation).
    fn alloc_input(&self, desc: &TensorDesc) -> Result<Tensor> {
        self.alloc(desc)
    }
    /// Ends the recording and makes it a graph; returns its handle.
    fn end_capture(&self) -> Result<GraphId> {
        Err(no_graphs(self.name()))
    }
    /// Ends a recording that went wrong, keeping nothing.
    fn abort_capture(&self) {}
    /// Runs graph `id` once: every recorded launch, in order, on the tensors it recorded.
    fn replay(&self, _id: GraphId) -> Result<()> {
        Err(no_graphs(self.name()))
    }
    /// Frees graph `id` and the memory it owns.
    fn drop_graph(&self, _id: GraphId) {}
}

/// A recorded graph's handle, unique per backend.
pub type GraphId = u64;

fn no_graphs(backend: &str) -> crate::Error {
    crate::Error::backend(backend, "this backend does not record graphs")
}

/// What [`Backend::submit_stats`] counts: kernel launches, graph replays, device copies and
/// uploads enqueued, and the host seconds `execute`, `replay` and `upload` (for WebGPU also
/// `alloc`, whose buffers cost the host as much as a dispatch) took to enqueue them.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct SubmitStats {
    pub launches: u64,
    pub host_seconds: f64,
}

/// A fresh, process-unique backend id.
pub fn next_backend_id() -> BackendId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The checks every backend's `execute` shares: the call fits the op, every tensor belongs
/// to `backend`, and no output overlaps an input or another output.
pub fn check_call(
    backend: &dyn Backend,
    op: &Op,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
) -> Result<OpDesc> {
    let desc = OpDesc::new(
        op.clone(),
        inputs.iter().map(|t| t.desc().clone()).collect(),
        outputs.iter().map(|t| t.desc().clone()).collect(),
    );
    desc.check()?;
    let op_err = |msg: String| crate::Error::Op {
        op: op.name().to_string(),
        msg,
        inputs: desc
            .inputs
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        outputs: desc
            .outputs
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    for (i, t) in inputs.iter().chain(outputs.iter()).enumerate() {
        if t.backend() != backend.id() {
            return Err(op_err(format!(
                "tensor {i} belongs to another backend than {} (#{})",
                backend.name(),
                backend.id()
            )));
        }
    }
    for (o, out) in outputs.iter().enumerate() {
        for (i, inp) in inputs.iter().enumerate() {
            if out.overlaps(inp) {
                return Err(op_err(format!("output {o} overlaps input {i}")));
            }
        }
        for (o2, out2) in outputs.iter().enumerate().skip(o + 1) {
            if out.overlaps(out2) {
                return Err(op_err(format!("output {o} overlaps output {o2}")));
            }
        }
    }
    Ok(desc)
}
