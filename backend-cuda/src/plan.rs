//! From an op to kernel launches, without touching a GPU.
//!
//! [`plan`] says which kernels (grid, block and arguments) run one op on the dtypes and shapes
//! of its [`OpDesc`], or `None` where no kernel fits: that is the whole of the backend's
//! `supports_op`. Because it is pure, the tests check every launch it makes for every
//! conformance case against the kernels' parsed signatures (argument count, kinds, pointer
//! element types, which pointers are written) and against CUDA's launch limits, on a machine
//! with no GPU.

use kiln_core::op::{GluOp, MoeGating, Op, OpDesc, UnaryOp};
use kiln_core::tensor::{DType, TensorDesc};

use crate::kernels;
use crate::names::{self, is_block_quantized, weight_kernels, WeightKernels};

mod attention;
mod mat_mul;
#[cfg(test)]
mod tests;

use attention::{plan_attention, plan_paged_attention};

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

/// The dimension `i` of `t`, or 0.
fn dim(t: &TensorDesc, i: usize) -> usize {
    t.shape.dim(i).unwrap_or(0)
}

/// The kernels that run `desc`, or `None` where this backend has none for it (the executor
/// then runs it on the CPU reference).
pub fn plan(desc: &OpDesc) -> Option<Vec<Step>> {
    desc.check().ok()?;
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Null, Out, F32, U32};
    match &desc.op {
        // The top-k form from the router (top-k, softmax over them), the row gather and the
        // weighted sum. The router takes a thread per position and k passes over the
        // vocabulary, so large k·V is left to a proper selection kernel (not written yet: the
        // model composes the op from the same kernels meanwhile). The dense form needs a
        // matmul by the untransposed table: composed by the model.
        Op::SoftEmbedding { top_k } => {
            use Arg::Scratch;
            (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
            let (t, v, e, k) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[1], 1), *top_k);
            (k > 0 && k < v && k.checked_mul(v)? <= 1 << 24).then_some(())?;
            let w = weight_kernels(i[1].dtype)?;
            let per_thread = match i[1].dtype {
                DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 => 1,
                _ => 8,
            };
            (e % per_thread == 0).then_some(())?;
            let mut steps = vec![
                Step::Scratch(TensorDesc::new(DType::F32, [t, k])),
                Step::Scratch(TensorDesc::new(DType::I32, [t, k])),
                Step::Scratch(TensorDesc::new(DType::F32, [t * k, e])),
            ];
            let route = vec![
                In(0),
                Scratch(0),
                Scratch(1),
                U32(u(t)?),
                U32(u(v)?),
                U32(u(k)?),
                U32(0),
                U32(1),
            ];
            steps.extend(launch1("moe_route_f32", t, route)?);
            let gather = vec![
                In(1),
                Scratch(1),
                Scratch(2),
                U32(u(t * k)?),
                U32(u(e)?),
                U32(u(v)?),
            ];
            steps.extend(launch1(w.get_rows, t * k * e / per_thread, gather)?);
            let sum = vec![
                Scratch(2),
                Scratch(0),
                Out(0),
                U32(u(t)?),
                U32(u(k)?),
                U32(u(e)?),
            ];
            steps.extend(launch1("moe_sum_f32", t * e, sum)?);
            Some(steps)
        }
        Op::Add | Op::Mul => {
            if !all_f32(i) || !all_f32(o) || i[1].numel() == 0 {
                return None;
            }
            let k = if desc.op == Op::Add {
                "add_f32"
            } else {
                "mul_f32"
            };
            let n = o[0].numel();
            launch1(
                k,
                n,
                vec![In(0), In(1), Out(0), U32(u(n)?), U32(u(i[1].numel())?)],
            )
        }
        Op::Scale(s) => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let n = o[0].numel();
            launch1("scale_f32", n, vec![In(0), Out(0), U32(u(n)?), F32(*s)])
        }
        Op::Unary(op) => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let code = UnaryOp::ALL.iter().position(|x| x == op)?;
            let n = o[0].numel();
            launch1(
                "unary_f32",
                n,
                vec![In(0), Out(0), U32(u(n)?), U32(code as u32)],
            )
        }
        Op::Glu(g) => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let act = match g {
                GluOp::SwiGlu => 0,
                GluOp::GeGlu => 1,
            };
            let n = o[0].numel();
            launch1(
                "glu_f32",
                n,
                vec![In(0), In(1), Out(0), U32(u(n)?), U32(act)],
            )
        }
        Op::RmsNorm { eps, one_plus } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let d = i[0].shape.last();
            let rows = i[0].numel() / d.max(1);
            one(
                "rms_norm_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![
                    In(0),
                    In(1),
                    Out(0),
                    U32(u(d)?),
                    F32(*eps),
                    U32(*one_plus as u32),
                ],
            )
        }
        Op::L2Norm { eps } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let d = i[0].shape.last();
            let rows = i[0].numel() / d.max(1);
            one(
                "l2_norm_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![In(0), Out(0), U32(u(d)?), F32(*eps)],
            )
        }
        Op::Rope(p) => {
            (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
            (i.get(2).is_none_or(|f| f.dtype == DType::F32)).then_some(())?;
            let (t, h, d) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            (p.n_rot % 2 == 0 && p.n_rot <= d && p.n_rot > 0).then_some(())?;
            let factors = if i.len() > 2 { In(2) } else { Null };
            let threads = t * h * (d - p.n_rot / 2);
            launch1(
                "rope_f32",
                threads,
                vec![
                    In(0),
                    In(1),
                    factors,
                    Out(0),
                    U32(u(t)?),
                    U32(u(h)?),
                    U32(u(d)?),
                    U32(u(p.n_rot)?),
                    U32((p.mode == kiln_core::op::RopeMode::Neox) as u32),
                    F32(p.base),
                    F32(p.freq_scale),
                    F32(p.attn_factor),
                    U32((i.len() > 2) as u32),
                ],
            )
        }
        Op::Softmax { scale, soft_cap } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let n = i[0].shape.last();
            let rows = i[0].numel() / n.max(1);
            let (mask, mask_rows) = match i.get(1) {
                Some(m) => (In(1), m.numel() / n.max(1)),
                None => (Null, 0),
            };
            let cap = soft_cap.unwrap_or(0.0);
            (cap >= 0.0).then_some(())?;
            one(
                "softmax_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![
                    In(0),
                    mask,
                    Out(0),
                    U32(u(n)?),
                    U32(u(mask_rows)?),
                    F32(*scale),
                    F32(cap),
                ],
            )
        }
        Op::GetRows => {
            (o[0].dtype == DType::F32 && i[1].dtype == DType::I32).then_some(())?;
            let (v, d) = (dim(&i[0], 0), dim(&i[0], 1));
            let n = i[1].numel();
            let args = vec![In(0), In(1), Out(0), U32(u(n)?), U32(u(d)?), U32(u(v)?)];
            let w = weight_kernels(i[0].dtype)?;
            // get_rows.cu's kernels (floats, Q8_0, Q4_0) take a thread per value; quant.cu's
            // a thread per 8 values.
            let per_thread = match i[0].dtype {
                DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 => 1,
                _ => 8,
            };
            launch1(w.get_rows, n * d / per_thread, args)
        }
        Op::MatMul | Op::MatMulAdd => mat_mul::plan_mat_mul(i, o),
        Op::MatMulId => mat_mul::plan_mat_mul_id(i, o),
        Op::MoeSum => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let (t, k, n) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            launch1(
                "moe_sum_f32",
                t * n,
                vec![In(0), In(1), Out(0), U32(u(t)?), U32(u(k)?), U32(u(n)?)],
            )
        }
        Op::MoeRoute {
            k,
            gating,
            normalize,
        } => {
            (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
            let (t, e) = (dim(&i[0], 0), dim(&i[0], 1));
            launch1(
                "moe_route_f32",
                t,
                vec![
                    In(0),
                    Out(0),
                    Out(1),
                    U32(u(t)?),
                    U32(u(e)?),
                    U32(u(*k)?),
                    U32((*gating == MoeGating::Sigmoid) as u32),
                    U32(*normalize as u32),
                ],
            )
        }
        Op::KvWrite => {
            all_f32(&i[..2]).then_some(())?;
            let t = dim(&i[0], 0);
            let hd = i[0].numel() / t.max(1);
            let hdv = i[1].numel() / t.max(1);
            // Cache rows: B · bs.
            let n_slots = dim(&o[0], 0) * dim(&o[0], 1);
            let kernel = match (o[0].dtype, o[1].dtype) {
                (DType::F32, DType::F32) => "kv_write_f32",
                (DType::F16, DType::F16) => "kv_write_f16",
                (kt, vt) => {
                    // Any other pair: a thread per 32-value block of a row.
                    let (kf, vf) = (names::kv_format(kt)?, names::kv_format(vt)?);
                    (hd % 32 == 0 && hdv % 32 == 0).then_some(())?;
                    return launch1(
                        "kv_write_kv",
                        t * (hd + hdv) / 32,
                        with_tensors(
                            3,
                            2,
                            [
                                U32(u(t)?),
                                U32(u(hd)?),
                                U32(u(hdv)?),
                                U32(u(n_slots)?),
                                U32(kf),
                                U32(vf),
                            ],
                        ),
                    );
                }
            };
            launch1(
                kernel,
                t * (hd + hdv),
                with_tensors(
                    3,
                    2,
                    [U32(u(t)?), U32(u(hd)?), U32(u(hdv)?), U32(u(n_slots)?)],
                ),
            )
        }
        Op::Attention(p) => plan_attention(p, i, o),
        Op::PagedAttention(p) => plan_paged_attention(p, i, o),
        Op::Conv1dDecode { silu } => {
            (all_f32(&i[..2]) && all_f32(o)).then_some(())?;
            let (s, c) = (dim(&i[0], 0), dim(&i[0], 1));
            let k = dim(&i[1], 1);
            let pool = dim(&o[1], 0);
            launch1(
                "conv1d_decode_f32",
                s * c,
                with_tensors(
                    3,
                    2,
                    [
                        U32(u(s)?),
                        U32(u(c)?),
                        U32(u(k)?),
                        U32(*silu as u32),
                        U32(u(pool)?),
                    ],
                ),
            )
        }
        Op::Conv1d { silu } => {
            (all_f32(&i[..3]) && all_f32(o)).then_some(())?;
            let (t, c) = (dim(&i[0], 0), dim(&i[0], 1));
            let (k, s) = (dim(&i[1], 1), dim(&i[2], 0));
            let mut steps = launch1(
                "conv1d_f32",
                t * c,
                with_tensors(
                    4,
                    1,
                    [
                        U32(u(t)?),
                        U32(u(c)?),
                        U32(u(k)?),
                        U32(u(s)?),
                        U32(*silu as u32),
                    ],
                ),
            )?;
            if s * (k - 1) * c > 0 {
                steps.extend(launch1(
                    "conv1d_state_f32",
                    s * (k - 1) * c,
                    vec![
                        In(0),
                        In(2),
                        In(3),
                        Out(1),
                        U32(u(t)?),
                        U32(u(c)?),
                        U32(u(k)?),
                        U32(u(s)?),
                    ],
                )?);
            }
            Some(steps)
        }
        Op::DeltaNet { scale, .. } => {
            // Every chunk size computes the same function; the kernel is the sequential form.
            (all_f32(&i[..6]) && all_f32(o)).then_some(())?;
            let (t, hk, dk) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            let (hv, dv, s) = (dim(&i[2], 1), dim(&i[2], 2), dim(&i[5], 0));
            (dk <= MAX_DK).then_some(())?;
            one(
                "delta_net_f32",
                (u(s)?, u(hv)?, 1),
                (128, 1, 1),
                with_tensors(
                    7,
                    2,
                    [
                        U32(u(hk)?),
                        U32(u(hv)?),
                        U32(u(dk)?),
                        U32(u(dv)?),
                        U32(u(t)?),
                        F32(*scale),
                    ],
                ),
            )
        }
        Op::DeltaNetDecode { scale, qk_l2norm } => {
            (all_f32(&i[..5]) && all_f32(o)).then_some(())?;
            let (s, hk, dk) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            let (hv, dv) = (dim(&i[2], 1), dim(&i[2], 2));
            (dk <= MAX_DK).then_some(())?;
            let pool = dim(&o[1], 0);
            one(
                "delta_net_decode_f32",
                (u(s)?, u(hv)?, 1),
                (128, 1, 1),
                with_tensors(
                    6,
                    2,
                    [
                        U32(u(hk)?),
                        U32(u(hv)?),
                        U32(u(dk)?),
                        U32(u(dv)?),
                        F32(*scale),
                        F32(qk_l2norm.unwrap_or(0.0)),
                        U32(qk_l2norm.is_some() as u32),
                        U32(u(pool)?),
                    ],
                ),
            )
        }
        Op::Cast => {
            let n = i[0].numel();
            let kernel = match (i[0].dtype, o[0].dtype) {
                (a, b) if a == b => return Some(vec![Step::Copy { from: 0, to: 0 }]),
                (DType::F32, DType::F16) => "cast_f32_f16",
                (DType::F32, DType::BF16) => "cast_f32_bf16",
                (DType::F16, DType::F32) => "cast_f16_f32",
                (DType::BF16, DType::F32) => "cast_bf16_f32",
                _ => return None,
            };
            launch1(kernel, n, vec![In(0), Out(0), U32(u(n)?)])
        }
        Op::Copy => Some(vec![Step::Copy { from: 0, to: 0 }]),
        Op::Argmax => {
            (i[0].dtype == DType::F32).then_some(())?;
            let n = i[0].shape.last();
            let rows = i[0].numel() / n.max(1);
            (n > 0).then_some(())?;
            one(
                "argmax_f32",
                (u(rows)?, 1, 1),
                (ARGMAX_THREADS, 1, 1),
                vec![In(0), Out(0), U32(u(n)?)],
            )
        }
        Op::CanvasDraw { scale, seed } => {
            let (t, v) = (dim(&i[0], 0), dim(&i[0], 1));
            (o[0].dtype == DType::F32 && o[3].dtype == DType::F32 && v > 0).then_some(())?;
            one(
                "canvas_draw_f32",
                (u(t)?, 1, 1),
                (CANVAS_THREADS, 1, 1),
                with_tensors(
                    1,
                    4,
                    [
                        U32(u(v)?),
                        F32(*scale),
                        U32(*seed as u32),
                        U32((*seed >> 32) as u32),
                    ],
                ),
            )
        }
        Op::CanvasAccept {
            entropy_bound,
            confidence,
            stability,
            vocab,
            seed,
        } => one(
            "canvas_accept",
            (1, 1, 1),
            (CANVAS_THREADS, 1, 1),
            with_tensors(
                3,
                3,
                [
                    U32(u(dim(&i[0], 0))?),
                    U32(u(*stability)?),
                    U32(u(*vocab)?),
                    F32(*entropy_bound),
                    F32(*confidence),
                    U32(*seed as u32),
                    U32((*seed >> 32) as u32),
                ],
            ),
        ),
        Op::TopK(k) => {
            // k rounds over the row: for sampling's small k; a large k runs on the CPU.
            (i[0].dtype == DType::F32 && *k <= MAX_TOP_K).then_some(())?;
            let n = i[0].shape.last();
            let rows = i[0].numel() / n.max(1);
            (n > 0 && *k >= 1 && *k <= n).then_some(())?;
            one(
                "top_k_f32",
                (u(rows)?, 1, 1),
                (TOPK_THREADS, 1, 1),
                vec![In(0), Out(0), Out(1), U32(u(n)?), U32(u(*k)?)],
            )
        }
        Op::RmsNormMatMul { eps, one_plus } => {
            mat_mul::plan_rms_norm_mat_mul(*eps, *one_plus, i, o)
        }
        Op::GluMatMul(g) => mat_mul::plan_glu_mat_mul(*g, i, o),
        // Not written yet: these run on the CPU reference through the executor (counted and
        // reported).
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
