//! From an op to kernel launches, without touching a GPU.
//!
//! [`plan`] says which kernels (grid, block and arguments) run one op on the dtypes and shapes
//! of its [`OpDesc`], or `None` where no kernel fits: that is the whole of the backend's
//! `supports_op`. Because it is pure, the tests check every launch it makes for every
//! conformance case against the kernels' parsed signatures (argument count, kinds, pointer
//! element types, which pointers are written) and against CUDA's launch limits, on a machine
//! with no GPU.

use kiln_core::op::{
    AttentionOp, CanvasOp, ConvOp, DeltaNetOp, ElementwiseOp, GetRowsOp, GluOp, MatMulOp,
    MoeGating, MoeOp, NormOp, Op, OpDesc, ReduceOp, RopeOp, SoftmaxOp, UnaryOp,
};
use kiln_core::tensor::{DType, TensorDesc};

use crate::kernels;
use crate::names::{is_block_quantized, weight_kernels, WeightKernels};

mod attention;
mod canvas;
mod conv;
mod delta_net;
mod elementwise;
mod get_rows;
mod mat_mul;
mod moe;
mod norm;
mod reduce;
mod rope;
mod softmax;
#[cfg(test)]
mod tests;

/// One kernel argument.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Arg {
    /// The device address of input `i`.
    In(usize),
    /// The device address of output `i`.
    Out(usize),
    /// A null pointer (an optional tensor that is absent).
    Null,
    /// The device address of the op's scratch tensor `i` (see [`Step::Scratch`]).
    Scratch(usize),
    U32(u32),
    I32(i32),
    F32(f32),
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static str,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub args: Vec<Arg>,
}

/// One step of an op.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Launch(Launch),
    /// Copies all of input `from`'s bytes to output `to` (same size).
    Copy {
        from: usize,
        to: usize,
    },
    /// A scratch tensor for the op's later steps, uninitialised, gone when the op is done;
    /// the n-th of an op's `Scratch` steps is its `Arg::Scratch(n)`.
    Scratch(TensorDesc),
}

/// The scratch tensors `steps` declare, in order.
pub fn scratch_descs(steps: &[Step]) -> Vec<TensorDesc> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Scratch(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

/// Threads per block of the elementwise kernels.
const BLOCK: u32 = 256;
/// The largest grid x dimension.
const MAX_GRID_X: u64 = (1 << 31) - 1;
/// The largest grid y and z dimensions.
const MAX_GRID_YZ: u32 = 65_535;
/// Head dims the attention kernels hold in registers (8 values per lane).
const MAX_HEAD_DIM: usize = 256;
/// Query heads per KV head the decode kernel serves from one K/V read.
const MAX_GROUP: usize = 8;
/// Blocks a decode attention launch aims for: enough to fill the largest GPUs (132 SMs on
/// an H100 SXM, 148 on a B200) twice over. Fewer (sequence, KV head) pairs than this split
/// the key range over several blocks.
const DECODE_TARGET_BLOCKS: usize = 2 * 148;
/// The fewest keys one split of a decode attention takes.
const MIN_SPLIT_KEYS: usize = 128;
/// Key dims the Gated DeltaNet decode kernel keeps in shared memory.
const MAX_DK: usize = 256;
/// Threads of the argmax kernel (`ARGMAX_THREADS` in reduce.cu; a power of two).
const ARGMAX_THREADS: u32 = 256;
/// Threads of the top-k kernel (`TOPK_THREADS` in reduce.cu; a power of two).
const TOPK_THREADS: u32 = 256;
/// The largest k the top-k kernel takes (it makes k passes over the row).
const MAX_TOP_K: usize = 256;
/// Threads of the canvas kernels (`CANVAS_THREADS` in canvas.cu).
const CANVAS_THREADS: u32 = 256;
/// Rows at or below which a matmul takes the mat-vec kernel.
const MAT_VEC_ROWS: usize = 4;
/// Output tile side and K step of the quantized prefill matmul (`QT`, `QK_STEP` in mat_mul.cu).
const QUANT_TILE: usize = 64;
const QUANT_TILE_K: usize = 32;
/// Threads of `moe_group` and the most experts it groups (`MOE_GROUP_THREADS`, `MAX_EXPERTS`
/// in moe.cu).
const MOE_GROUP_THREADS: u32 = 256;
const MAX_EXPERTS: usize = 1024;

/// Outputs per block and threads of the decode mat-vec kernels (`MV_ROWS`, `MV_WARPS · 32` in
/// mat_vec.cuh's `mat_vec_rows`): every `mat_vec_*`, `rms_norm_mat_vec_*` and `glu_mat_vec_*`.
const MV_ROWS: usize = 4;
const MV_THREADS: u32 = 128;

/// The kernels of a block-quantized weight type.
fn quantized(d: DType) -> Option<&'static WeightKernels> {
    is_block_quantized(d).then(|| weight_kernels(d))?
}

fn u(n: usize) -> Option<u32> {
    u32::try_from(n).ok()
}

/// A 1-D grid of `threads` threads in blocks of `BLOCK`. The kernels compute their global
/// thread index `blockIdx.x * blockDim.x + threadIdx.x` in 32 bits, so every thread of the
/// grid, the rounded-up last block included, must have an index that fits: larger ops are not
/// planned (they run on the CPU) rather than wrapping around.
fn grid1(threads: usize) -> Option<(u32, u32, u32)> {
    let blocks = (threads as u64).div_ceil(BLOCK as u64).max(1);
    let fits = blocks * BLOCK as u64 <= u32::MAX as u64 + 1;
    (fits && blocks <= MAX_GRID_X).then_some((blocks as u32, 1, 1))
}

fn launch1(kernel: &'static str, threads: usize, args: Vec<Arg>) -> Option<Vec<Step>> {
    Some(vec![Step::Launch(Launch {
        kernel,
        grid: grid1(threads)?,
        block: (BLOCK, 1, 1),
        args,
    })])
}

fn one(
    kernel: &'static str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    args: Vec<Arg>,
) -> Option<Vec<Step>> {
    let ok = grid.0 >= 1
        && grid.1 >= 1
        && grid.1 <= MAX_GRID_YZ
        && grid.2 >= 1
        && grid.2 <= MAX_GRID_YZ
        && (grid.0 as u64) <= MAX_GRID_X;
    ok.then(|| {
        vec![Step::Launch(Launch {
            kernel,
            grid,
            block,
            args,
        })]
    })
}

/// Kernel arguments that start with the op's tensors: inputs `0..n_in`, outputs `0..n_out`,
/// then `rest`.
fn with_tensors<const N: usize>(n_in: usize, n_out: usize, rest: [Arg; N]) -> Vec<Arg> {
    (0..n_in)
        .map(Arg::In)
        .chain((0..n_out).map(Arg::Out))
        .chain(rest)
        .collect()
}

fn all_f32(ts: &[TensorDesc]) -> bool {
    ts.iter().all(|t| t.dtype == DType::F32)
}

/// Whether the fusions that only save launches (several weights behind one norm in one grid,
/// the residual add in a mat-vec's epilogue, RoPE with the K/V write) are planned: the knob
/// `FUSE_LAUNCHES=0` of `KILN_CUDA_DEFINES` declines them (the model then takes the launch per
/// op), for before/after runs on a GPU.
fn fuse_launches() -> bool {
    kernels::knob("FUSE_LAUNCHES") != Some(0)
}

/// The dimension `i` of `t`, or 0.
fn dim(t: &TensorDesc, i: usize) -> usize {
    t.shape.dim(i).unwrap_or(0)
}

/// The kernels that run `desc`, or `None` where this backend has none for it (the executor
/// then runs it on the CPU reference).
pub fn plan(desc: &OpDesc) -> Option<Vec<Step>> {
    desc.check().ok()?;
    match &desc.op {
        Op::MatMul(f) => mat_mul::plan_op(f, desc),
        Op::GetRows(f) => get_rows::plan_op(f, desc),
        Op::Elementwise(f) => elementwise::plan_op(f, desc),
        Op::Norm(f) => norm::plan_op(f, desc),
        Op::Rope(f) => rope::plan_op(f, desc),
        Op::Softmax(f) => softmax::plan_op(f, desc),
        Op::Attention(f) => attention::plan_op(f, desc),
        Op::Reduce(f) => reduce::plan_op(f, desc),
        Op::Conv(f) => conv::plan_op(f, desc),
        Op::DeltaNet(f) => delta_net::plan_op(f, desc),
        Op::Moe(f) => moe::plan_op(f, desc),
        Op::Canvas(f) => canvas::plan_op(f, desc),
    }
}

/// Checks one launch against the kernel's declaration: the argument count, each argument's
/// kind, each pointer's element type against its tensor's dtype, that outputs go to pointers
/// the kernel may write and inputs to ones it may not, and CUDA's block limits. The launcher
/// runs this before every launch; the tests run it on every conformance case.
pub fn check_launch<I, O, S>(
    sig: &crate::kernels::Signature,
    l: &Launch,
    inputs: &[I],
    outputs: &[O],
    scratch: &[S],
) -> Result<(), String>
where
    I: std::borrow::Borrow<TensorDesc>,
    O: std::borrow::Borrow<TensorDesc>,
    S: std::borrow::Borrow<TensorDesc>,
{
    use crate::kernels::{Elem, Param};
    let k = l.kernel;
    if sig.params.len() != l.args.len() {
        return Err(format!(
            "{k}: {} arguments for {} parameters",
            l.args.len(),
            sig.params.len()
        ));
    }
    let threads = l.block.0 as u64 * l.block.1 as u64 * l.block.2 as u64;
    if threads == 0 || threads > 1024 || !threads.is_multiple_of(32) {
        return Err(format!("{k}: a block of {threads} threads"));
    }
    let elem_ok = |e: Elem, d: DType| match e {
        Elem::F32 => d == DType::F32,
        Elem::F16 => d == DType::F16,
        Elem::BF16 => d == DType::BF16,
        Elem::I32 => d == DType::I32,
        // Raw bytes: block formats, and floats where a `_kv` kernel decodes them itself.
        Elem::Bytes => d.is_quantized() || d.is_float(),
    };
    for (n, (p, a)) in sig.params.iter().zip(&l.args).enumerate() {
        let ok = match (*p, *a) {
            (Param::Ptr { elem, mutable }, Arg::In(i)) => {
                !mutable
                    && inputs
                        .get(i)
                        .is_some_and(|t| elem_ok(elem, t.borrow().dtype))
            }
            (Param::Ptr { elem, mutable }, Arg::Out(o)) => {
                mutable
                    && outputs
                        .get(o)
                        .is_some_and(|t| elem_ok(elem, t.borrow().dtype))
            }
            // Scratch is written by one step and read by the next.
            (Param::Ptr { elem, .. }, Arg::Scratch(i)) => scratch
                .get(i)
                .is_some_and(|t| elem_ok(elem, t.borrow().dtype)),
            // A kernel taking an optional pointer checks it for null.
            (Param::Ptr { .. }, Arg::Null) => true,
            (Param::U32, Arg::U32(_)) | (Param::I32, Arg::I32(_)) | (Param::F32, Arg::F32(_)) => {
                true
            }
            _ => false,
        };
        if !ok {
            return Err(format!(
                "{k}: argument {n} is {a:?}, the parameter is {p:?}"
            ));
        }
    }
    Ok(())
}
