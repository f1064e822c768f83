//! The matmul family's launches: the decode mat-vec and prefill GEMMs (`mat_mul_vec.cu`,
//! `quant.cu`, `mat_mul.cu`), the fusions into the mat-vec (`mat_mul_fused.cu`: RMSNorm over one to
//! three weights, the GLU, the residual epilogue), and the matmul by expert id (`moe.cu`).

use kiln_core::op::GluOp;
use kiln_core::tensor::{DType, TensorDesc};

use super::*;

/// Threads of `quantize_x8` and of the `mat_vec_x8_*` kernels (`X8_THREADS`), and the values
/// a `quantize_x8` block takes (`X8_VALUES`).
const X8_THREADS: u32 = 128;
const X8_VALUES: usize = 1024;

/// The int8-activation decode mat-vec of weight type `d` (`mat_mul_vec_x8.cu`), where the type
/// has one and the `MV_X8=0` knob does not decline it (measured on an H200 against the f32
/// lane-per-row kernel, README: 1.43× the 8 B Q4_K's decode).
fn x8_kernel(d: DType) -> Option<&'static str> {
    (kernels::knob("MV_X8") != Some(0)).then_some(())?;
    match d {
        DType::Q4_K => Some("mat_vec_x8_q4_k"),
        _ => None,
    }
}

/// What `quantize_x8` makes of its inputs (its `kind`, `eps`, `add`, `act`).
#[derive(Copy, Clone)]
enum X8Source {
    /// The activations as they are (input 0).
    Plain,
    /// rms_norm(input 0) with weight input 1 (+ `add`).
    RmsNorm { eps: f32, add: f32 },
    /// act(input 0) · input 1 (0 SiLU, 1 tanh-GELU).
    Glu(u32),
}

/// The decode mat-vec over int8 activation parts: `quantize_x8` writes the source's rows as
/// parts into scratch (`MVX_PARTS` bytes a value and 8 bytes a group of 32: x8_row_bytes in
/// the kernel file), then `kernel` multiplies them into the weights (inputs `weights`, their
/// rows `rows`, outputs 0..), adding `res` where given (one weight only). `m` token rows of
/// `k` values, k a multiple of 256.
fn plan_x8(
    kernel: &'static str,
    src: X8Source,
    m: usize,
    k: usize,
    weights: &[usize],
    rows: &[usize],
    res: Arg,
) -> Option<Vec<Step>> {
    use Arg::{In, Null, Out, Scratch, F32, U32};
    (k % 256 == 0 && m >= 1 && weights.len() == rows.len() && (1..=3).contains(&weights.len()))
        .then_some(())?;
    let parts = kernels::knob("MVX_PARTS").unwrap_or(3) as usize;
    let row_bytes = k * parts + k / 4;
    let (kind, b, eps, add, act) = match src {
        X8Source::Plain => (0, Null, 0.0, 0.0, 0),
        X8Source::RmsNorm { eps, add } => (1, In(1), eps, add, 0),
        X8Source::Glu(act) => (2, In(1), 0.0, 0.0, act),
    };
    let mut steps = vec![Step::Scratch(TensorDesc::new(
        DType::F32,
        [m * row_bytes / 4],
    ))];
    steps.extend(one(
        "quantize_x8",
        (u(k.div_ceil(X8_VALUES))?, u(m)?, 1),
        (X8_THREADS, 1, 1),
        vec![
            In(0),
            b,
            Scratch(0),
            U32(u(m)?),
            U32(u(k)?),
            U32(kind),
            F32(eps),
            F32(add),
            U32(act),
        ],
    )?);
    // The split kernel (MVX_SPLIT=1, the default): a block takes MVX_ROWS rows (8 unless set),
    // a warp for every 4 of the rows' 256-value blocks, at most 4. The staged one: a warp takes
    // MVX_ROWS rows (2 unless set), a block 4 warps.
    let split = kernels::knob("MVX_SPLIT") != Some(0);
    let rows_knob = kernels::knob("MVX_ROWS").map(|r| r as usize);
    // The tensor-core form (MVX_MMA=1): 16 rows a block, the rows' 256-value blocks spread
    // evenly over at most MVX_WARPS warps (8 unless set): 12 blocks take 6 warps of 2, not 8
    // warps of 2 and 1.
    let mma = kernel == "mat_vec_x8_q4_k" && kernels::knob("MVX_MMA") == Some(1);
    let kernel = if mma { "mat_vec_x8_q4_k_mma" } else { kernel };
    let (per_block, threads) = if mma {
        let most = kernels::knob("MVX_WARPS").map_or(8, |w| w as usize).max(1);
        let nb = (k / 256).max(1);
        (16, 32 * nb.div_ceil(nb.div_ceil(most)))
    } else if split {
        let warps = (k / 256).div_ceil(4).clamp(1, X8_THREADS as usize / 32);
        (rows_knob.unwrap_or(8), 32 * warps)
    } else {
        let warps = X8_THREADS as usize / 32;
        (warps * rows_knob.unwrap_or(2), X8_THREADS as usize)
    };
    let blocks: usize = rows.iter().map(|n| n.div_ceil(per_block)).sum();
    let w = |j: usize| weights.get(j).map_or(Null, |&i| In(i));
    let y = |j: usize| if j < weights.len() { Out(j) } else { Null };
    let n = |j: usize| u(rows.get(j).copied().unwrap_or(0));
    steps.extend(one(
        kernel,
        (u(blocks)?, u(m)?, 1),
        (u(threads)?, 1, 1),
        vec![
            Scratch(0),
            w(0),
            w(1),
            w(2),
            res,
            y(0),
            y(1),
            y(2),
            U32(u(m)?),
            U32(n(0)?),
            U32(n(1)?),
            U32(n(2)?),
            U32(u(k)?),
        ],
    )?);
    Some(steps)
}

/// `RmsNormMatMul`: the norm read into the decode mat-vec, over one weight (a launch) or two or
/// three of one type (one launch for all).
pub(super) fn plan_rms_norm_mat_mul(
    eps: f32,
    one_plus: bool,
    i: &[TensorDesc],
    o: &[TensorDesc],
) -> Option<Vec<Step>> {
    use Arg::{In, Null, Out, F32, U32};
    if i.len() > 3 {
        // Two or three weights of one type in one launch, the grid's blocks over their
        // rows in order (mat_mul_fused.cu's rms_norm_mat_vecs); decode only, as below.
        fuse_launches().then_some(())?;
        (all_f32(&i[..2]) && all_f32(o)).then_some(())?;
        let dtype = i[2].dtype;
        i[3..].iter().all(|w| w.dtype == dtype).then_some(())?;
        let k = dim(&i[2], 1);
        let m = i[0].numel() / k.max(1);
        (m <= MAT_VEC_ROWS && k % 8 == 0).then_some(())?;
        let add = if one_plus { 1.0 } else { 0.0 };
        if let Some(x8) = x8_kernel(dtype).filter(|_| k % 256 == 0) {
            let rows: Vec<usize> = i[2..].iter().map(|w| dim(w, 0)).collect();
            let weights: Vec<usize> = (2..i.len()).collect();
            return plan_x8(
                x8,
                X8Source::RmsNorm { eps, add },
                m,
                k,
                &weights,
                &rows,
                Null,
            );
        }
        let kernel = weight_kernels(dtype)?.rms_norm_mat_vecs;
        let rows = i[2..]
            .iter()
            .map(|w| u(dim(w, 0)))
            .collect::<Option<Vec<u32>>>()?;
        let blocks: usize = rows.iter().map(|&n| (n as usize).div_ceil(MV_ROWS)).sum();
        let w = |j: usize| {
            if j + 2 < i.len() {
                In(j + 2)
            } else {
                Null
            }
        };
        let y = |j: usize| if j < o.len() { Out(j) } else { Null };
        let n = |j: usize| U32(rows.get(j).copied().unwrap_or(0));
        return one(
            kernel,
            (u(blocks)?, u(m)?, 1),
            (MV_THREADS, 1, 1),
            vec![
                In(0),
                In(1),
                w(0),
                w(1),
                w(2),
                y(0),
                y(1),
                y(2),
                U32(u(m)?),
                n(0),
                n(1),
                n(2),
                U32(u(k)?),
                F32(eps),
                U32(one_plus as u32),
            ],
        );
    }
    // Decode only: at prefill sizes the plain norm and GEMM are the better kernels.
    (all_f32(&i[..2]) && o[0].dtype == DType::F32).then_some(())?;
    let (n, k) = (dim(&i[2], 0), dim(&i[2], 1));
    let m = i[0].numel() / k.max(1);
    (m <= MAT_VEC_ROWS && k % 8 == 0).then_some(())?;
    if let Some(x8) = x8_kernel(i[2].dtype).filter(|_| k % 256 == 0) {
        let add = if one_plus { 1.0 } else { 0.0 };
        let src = X8Source::RmsNorm { eps, add };
        return plan_x8(x8, src, m, k, &[2], &[n], Arg::Null);
    }
    let kernel = weight_kernels(i[2].dtype)?.rms_norm_mat_vec;
    one(
        kernel,
        (u(n.div_ceil(MV_ROWS))?, u(m)?, 1),
        (MV_THREADS, 1, 1),
        with_tensors(
            3,
            1,
            [
                U32(u(m)?),
                U32(u(n)?),
                U32(u(k)?),
                F32(eps),
                U32(one_plus as u32),
            ],
        ),
    )
}

/// `GluMatMul`: the GLU made as the decode mat-vec reads its input, and the residual (input 3,
/// where given) added as each output is written.
pub(super) fn plan_glu_mat_mul(g: GluOp, i: &[TensorDesc], o: &[TensorDesc]) -> Option<Vec<Step>> {
    use Arg::{In, Null, Out, U32};
    (all_f32(&i[..2]) && o[0].dtype == DType::F32).then_some(())?;
    let (n, k) = (dim(&i[2], 0), dim(&i[2], 1));
    let m = i[0].numel() / k.max(1);
    (m <= MAT_VEC_ROWS && k % 8 == 0).then_some(())?;
    let kernel = weight_kernels(i[2].dtype)?.glu_mat_vec;
    let act = match g {
        GluOp::SwiGlu => 0,
        GluOp::GeGlu => 1,
    };
    // The residual, where given (input 3), added as each output is written.
    (i.len() == 3 || fuse_launches()).then_some(())?;
    let r = if i.len() > 3 { In(3) } else { Null };
    if let Some(x8) = x8_kernel(i[2].dtype).filter(|_| k % 256 == 0) {
        return plan_x8(x8, X8Source::Glu(act), m, k, &[2], &[n], r);
    }
    one(
        kernel,
        (u(n.div_ceil(MV_ROWS))?, u(m)?, 1),
        (MV_THREADS, 1, 1),
        vec![
            In(0),
            In(1),
            In(2),
            r,
            Out(0),
            U32(u(m)?),
            U32(u(n)?),
            U32(u(k)?),
            U32(act),
        ],
    )
}

/// Matmul by expert id. Prefill on block-quantized, F32 or BF16 weights groups the slots by expert and runs
/// the tiled GEMM per expert; otherwise a warp per output.
pub(super) fn plan_mat_mul_id(i: &[TensorDesc], o: &[TensorDesc]) -> Option<Vec<Step>> {
    use Arg::{In, Out, Scratch, U32};
    (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
    let (ne, n, kd) = (dim(&i[1], 0), dim(&i[1], 1), dim(&i[1], 2));
    let (t, k) = (dim(&i[2], 0), dim(&i[2], 1));
    // Like the CPU: a row per slot only when x is [T, k, K] with k > 1; [T, 1, K] and [T, K]
    // share each token's row among its slots.
    let x_per_slot = U32((i[0].shape.rank() == 3 && dim(&i[0], 1) == k && k > 1) as u32);
    let slots = t * k;
    let grouped = weight_kernels(i[1].dtype).and_then(|w| w.mat_mul_id_grouped);
    // Every expert's tiles, at most: a partial tile each beside the full ones. Past the grid's
    // limit, the per-output kernel below takes the op.
    let tiles = slots.div_ceil(QUANT_TILE) + ne;
    if let Some(kernel) = grouped.filter(|_| {
        t > MAT_VEC_ROWS
            && kd % QUANT_TILE_K == 0
            && ne > 0
            && ne <= MAX_EXPERTS
            && tiles <= MAX_GRID_YZ as usize
    }) {
        let mut steps = vec![
            Step::Scratch(TensorDesc::new(DType::I32, [slots])),
            Step::Scratch(TensorDesc::new(DType::I32, [ne + 1])),
            Step::Scratch(TensorDesc::new(DType::I32, [ne + 1])),
        ];
        // With MM_TC=1, the tensor-core tile over x's rows split once (scratch 3).
        let tc = tc_kernels(i[1].dtype).map(|(_, id)| id);
        let mx = i[0].numel() / kd.max(1);
        let split = tc.and_then(|id| Some((id, tc_split(mx, kd, 3)?)));
        let tc = split.as_ref().map(|(id, _)| *id);
        let (kernel, x) = match split {
            Some((id, split)) => {
                steps.extend(split);
                (id, Scratch(3))
            }
            None => (kernel, In(0)),
        };
        steps.extend(one(
            "moe_group",
            (1, 1, 1),
            (MOE_GROUP_THREADS, 1, 1),
            vec![
                In(2),
                Scratch(0),
                Scratch(1),
                Scratch(2),
                Out(0),
                U32(u(slots)?),
                U32(u(ne)?),
                U32(u(n)?),
            ],
        )?);
        let mut args = vec![
            x,
            In(1),
            Scratch(0),
            Scratch(1),
            Scratch(2),
            Out(0),
            U32(u(k)?),
            U32(u(n)?),
            U32(u(kd)?),
            x_per_slot,
            U32(u(ne)?),
        ];
        let (cols, threads) = if tc.is_some() {
            args.push(U32(u(mx)?));
            (TC_ROWS_W, TC_THREADS)
        } else {
            (QUANT_TILE, 256)
        };
        steps.extend(one(
            kernel,
            (u(n.div_ceil(cols))?, u(tiles)?, 1),
            (threads, 1, 1),
            args,
        )?);
        return Some(steps);
    }
    let kernel = match i[1].dtype {
        DType::F32 => "mat_mul_id_f32",
        DType::BF16 => "mat_mul_id_bf16",
        q => quantized(q)?.mat_mul_id?,
    };
    launch1(
        kernel,
        slots * n * 32,
        with_tensors(
            3,
            1,
            [
                U32(u(t)?),
                U32(u(k)?),
                U32(u(n)?),
                U32(u(kd)?),
                x_per_slot,
                U32(u(ne)?),
            ],
        ),
    )
}

pub(super) fn plan_mat_mul(i: &[TensorDesc], o: &[TensorDesc]) -> Option<Vec<Step>> {
    use Arg::{In, Out, U32};
    (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
    let (n, k) = (dim(&i[1], 0), dim(&i[1], 1));
    let m = i[0].numel() / k.max(1);
    let args = vec![In(0), In(1), Out(0), U32(u(m)?), U32(u(n)?), U32(u(k)?)];
    let w = weight_kernels(i[1].dtype)?;
    let residual = i.len() > 2;
    (!residual || fuse_launches()).then_some(())?;
    // The mat-vec reads 8 values at a time: float rows of another length take the GEMM.
    if m > MAT_VEC_ROWS || k % 8 != 0 {
        // MatMulAdd's epilogue is the mat-vec's: at prefill sizes the GEMM and the add.
        if residual {
            return None;
        }
        if !is_block_quantized(i[1].dtype) && k % QUANT_TILE_K != 0 {
            return one(
                w.mat_mul,
                (u(n.div_ceil(32))?, u(m.div_ceil(32))?, 1),
                (32, 8, 1),
                args,
            );
        }
        if let Some(steps) = plan_tc(i[1].dtype, m, n, k) {
            return Some(steps);
        }
        // Every block format's rows are whole blocks of 32 or more, so this holds for any
        // well-formed weight (and such rows suit the mat-vec below too); float weights whose
        // rows are take the same tile.
        if k % QUANT_TILE_K == 0 {
            return one(
                w.mat_mul_tiles,
                (u(n.div_ceil(QUANT_TILE))?, u(m.div_ceil(QUANT_TILE))?, 1),
                (256, 1, 1),
                args,
            );
        }
    }
    // Decode: four outputs per block, one grid row per activation row; the residual (input 2
    // of MatMulAdd) added as each output is written.
    let r = if residual { In(2) } else { Arg::Null };
    if let Some(x8) = x8_kernel(i[1].dtype).filter(|_| k % 256 == 0) {
        return plan_x8(x8, X8Source::Plain, m, k, &[1], &[n], r);
    }
    one(
        w.mat_vec,
        (u(n.div_ceil(MV_ROWS))?, u(m)?, 1),
        (MV_THREADS, 1, 1),
        vec![In(0), In(1), r, Out(0), U32(u(m)?), U32(u(n)?), U32(u(k)?)],
    )
}

/// Threads of `tc_split` (`TC_SPLIT_THREADS`) and the values a block of it takes
/// (`TC_SPLIT_VALUES`); threads of `mat_mul_tc_*` (`TC_THREADS`) and its tile (`TC_ROWS_W`
/// weight rows × `TC_ROWS_X` activation rows).
const TC_SPLIT_THREADS: u32 = 128;
const TC_SPLIT_VALUES: usize = 1024;
const TC_THREADS: u32 = 256;
const TC_ROWS_W: usize = 128;
const TC_ROWS_X: usize = 64;
/// Tiles that keep a GPU busy: two blocks on each of an H100's or H200's 132 SMs.
const TC_FILL: usize = 264;

/// With the `MM_TC=1` knob, the tensor-core kernels of weight type `d` (`mat_mul_tc.cu`): the
/// dense matmul's and the grouped MoE matmul's, where the type has integer codes.
fn tc_kernels(d: DType) -> Option<(&'static str, &'static str)> {
    (kernels::knob("MM_TC") == Some(1)).then_some(())?;
    Some(match d {
        DType::Q8_0 => ("mat_mul_tc_q8_0", "mat_mul_tc_id_q8_0"),
        DType::Q4_0 => ("mat_mul_tc_q4_0", "mat_mul_tc_id_q4_0"),
        DType::Q4_1 => ("mat_mul_tc_q4_1", "mat_mul_tc_id_q4_1"),
        DType::Q4_K => ("mat_mul_tc_q4_k", "mat_mul_tc_id_q4_k"),
        DType::Q6_K => ("mat_mul_tc_q6_k", "mat_mul_tc_id_q6_k"),
        DType::BF16 => ("mat_mul_tc_bf16", "mat_mul_tc_id_bf16"),
        _ => return None,
    })
}

/// `tc_split` of input 0's `m` rows of `k` into a new scratch (number `at` of the plan's):
/// `MM_PARTS` bf16 parts a value and 16-value sums (`tc_part_bytes` in the kernel file).
fn tc_split(m: usize, k: usize, at: usize) -> Option<Vec<Step>> {
    use Arg::{In, Scratch, U32};
    let parts = kernels::knob("MM_PARTS").unwrap_or(3) as usize;
    let bytes = m.checked_mul(2 * parts * k + k / 4)?;
    let mut steps = vec![Step::Scratch(TensorDesc::new(DType::F32, [bytes / 4]))];
    steps.extend(one(
        "tc_split",
        (u(m)?, u(k.div_ceil(TC_SPLIT_VALUES))?, 1),
        (TC_SPLIT_THREADS, 1, 1),
        vec![In(0), Scratch(at), U32(u(m)?), U32(u(k)?)],
    )?);
    Some(steps)
}

/// The dense prefill matmul on the tensor cores (`mat_mul_tc.cu`), with the `MM_TC=1` knob
/// and for the weight types with codes: `tc_split` writes `x`'s rows as `MM_PARTS` bf16 parts
/// and 16-value sums into scratch (`tc_part_bytes` in the kernel file), then `mat_mul_tc_<fmt>`
/// multiplies them into the weight. `k` a multiple of 32.
fn plan_tc(d: DType, m: usize, n: usize, k: usize) -> Option<Vec<Step>> {
    use Arg::{In, Out, Scratch, U32};
    (k % QUANT_TILE_K == 0 && m > 0).then_some(())?;
    let (kernel, _) = tc_kernels(d)?;
    // Too few tiles to fill the GPU (a batch of decodes: 64 rows, 32 tiles on a 4096-row
    // weight) split K among blocks, at least 8 steps each; TC_SPLITS sets the count.
    let tiles = n.div_ceil(TC_ROWS_W) * m.div_ceil(TC_ROWS_X);
    let most = (k / QUANT_TILE_K / 8).clamp(1, 16);
    let splits = match kernels::knob("TC_SPLITS") {
        Some(s) => s as usize,
        None => TC_FILL.div_ceil(tiles),
    }
    .clamp(1, most);
    let mut steps = vec![];
    steps.extend(tc_split(m, k, 0)?);
    if splits > 1 {
        steps.push(Step::Scratch(TensorDesc::new(
            DType::F32,
            [splits.checked_mul(m)?.checked_mul(n)?],
        )));
    }
    steps.extend(one(
        kernel,
        (
            u(n.div_ceil(TC_ROWS_W))?,
            u(m.div_ceil(TC_ROWS_X))?,
            u(splits)?,
        ),
        (TC_THREADS, 1, 1),
        vec![
            Scratch(0),
            In(1),
            if splits > 1 { Scratch(1) } else { Out(0) },
            U32(u(m)?),
            U32(u(n)?),
            U32(u(k)?),
            U32(u(splits)?),
        ],
    )?);
    if splits > 1 {
        steps.extend(launch1(
            "tc_reduce",
            m * n,
            vec![Scratch(1), Out(0), U32(u(m * n)?), U32(u(splits)?)],
        )?);
    }
    Some(steps)
}

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &MatMulOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    match op {
        MatMulOp::MatMul | MatMulOp::MatMulAdd => plan_mat_mul(i, o),
        MatMulOp::RmsNormMatMul { eps, one_plus } => plan_rms_norm_mat_mul(*eps, *one_plus, i, o),
        MatMulOp::GluMatMul(g) => plan_glu_mat_mul(*g, i, o),
    }
}
