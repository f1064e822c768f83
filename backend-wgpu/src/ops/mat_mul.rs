//! `mat_mul`: x [.., K] (f32) times w [N, K] (any weight format, decoded in the kernel).
//! Weights larger than one storage binding are multiplied in row ranges that each fit.

use kiln_core::op::{ElementwiseOp, MatMulOp, Op, OpDesc};
use kiln_core::tensor::{DType, Tensor, TensorDesc};
use kiln_core::Result;

use super::{bind, err, u};
use crate::device::{fold, Device};
use crate::kernels;

const ROWS_PER_GROUP: usize = 4;
const TOKENS_PER_GROUP: usize = 8;
/// The tiled kernel's tile: tokens by output features.
const TILE_M: usize = 64;
const TILE_N: usize = 64;
/// From this many tokens on, the tiled kernel (each weight chunk decoded once per 64 tokens,
/// activations reused from workgroup memory); below it, the row kernel (a chunk decoded once
/// per 8 tokens, a few tokens spread over 16 times as many workgroups). On lavapipe the two
/// cost the same per token at about 20 tokens.
const TILED_MIN_TOKENS: usize = 24;

pub(super) fn supports(dev: &Device, d: &OpDesc) -> bool {
    let (x, w, y) = (&d.inputs[0], &d.inputs[1], &d.outputs[0]);
    let row_bytes = w.dtype.bytes_for(w.shape.last()).unwrap_or(usize::MAX);
    x.dtype == DType::F32
        && y.dtype == DType::F32
        && kernels::mat_mul(w.dtype).is_some()
        && w.shape.rank() == 2
        && (w.dtype.block_size() == 1 || w.shape.last() % 32 == 0)
        && dev.fits_binding(x.nbytes().unwrap_or(usize::MAX))
        && dev.fits_binding(y.nbytes().unwrap_or(usize::MAX))
        && dev.fits_binding(row_bytes.saturating_mul(ROWS_PER_GROUP))
}

pub(super) fn mat_mul(dev: &Device, x: &Tensor, w: &Tensor, y: &Tensor) -> Result<()> {
    mat_mul_r(dev, x, w, None, y)
}

/// [`mat_mul`], with the residual `r` added where given (one activation row only: the
/// mat-vec's epilogue, which the family's `supports_op` asks for).
fn mat_mul_r(dev: &Device, x: &Tensor, w: &Tensor, r: Option<&Tensor>, y: &Tensor) -> Result<()> {
    let kernel = kernels::mat_mul(w.dtype())
        .ok_or_else(|| err(format!("mat_mul: no kernel for {} weights", w.dtype())))?;
    let k = x.shape().last();
    let n = w.shape().dims()[0];
    let m = x.numel() / k.max(1);
    let row_bytes = w.nbytes() / n.max(1);
    // Rows per launch: as many as fit one binding.
    let per = dev.rows_per_binding(n, row_bytes);
    // One token: the matvec kernel, which reads whole 32-element chunks (always so for the
    // block formats; float rows of other lengths keep mat_mul).
    let vec_kernel = kernels::mat_vec(w.dtype()).filter(|_| m == 1 && k % 32 == 0);
    if r.is_some() && vec_kernel.is_none() {
        return Err(err(
            "mat_mul with a residual: only for one row a multiple of 32 long",
        ));
    }
    let tiled = kernels::mat_mul_tiled(w.dtype()).filter(|_| m >= TILED_MIN_TOKENS);
    let per_group = if tiled.is_some() {
        TILE_N
    } else {
        ROWS_PER_GROUP
    };
    let mut n0 = 0;
    while n0 < n {
        let nn = per.min(n - n0);
        let part = if nn == n {
            w.clone()
        } else {
            w.view(n0 * k, [nn, k])?
        };
        let res = r.unwrap_or(&dev.dummy);
        let with_r = [(x, 4), (&part, 1), (y, 4), (res, 4)];
        // The mat-vec binds a residual (the dummy where none); the others do not.
        let (bound, offs) = bind(dev, &with_r[..if vec_kernel.is_some() { 4 } else { 3 }])?;
        let (gx, gz) = fold(
            u(nn.div_ceil(per_group))?,
            dev.limits.max_compute_workgroups_per_dimension,
        );
        let (k_row, offs_w) = (u(row_bytes)?, [offs[0], offs[1]]);
        match (vec_kernel, tiled) {
            (Some(vk), _) => {
                let mut params = vec![u(nn)?, u(k)?];
                params.extend(offs_w);
                params.extend([k_row, offs[2], u(n0)?, gx, offs[3], u32::from(r.is_some())]);
                dev.dispatch_bound(vk, &bound, &params, [gx, 1, gz])?;
            }
            (None, tk) => {
                // The row and tiled kernels share one parameter block.
                let mut params = vec![u(m)?, u(nn)?, u(k)?];
                params.extend(offs_w);
                params.extend([k_row, offs[2], u(n)?, u(n0)?, gx]);
                let (kern, per_y) = match tk {
                    Some(t) => (t, TILE_M),
                    None => (kernel, TOKENS_PER_GROUP),
                };
                let gy = u(m.div_ceil(per_y))?;
                dev.dispatch_bound(kern, &bound, &params, [gx, gy, gz])?;
            }
        }
        n0 += nn;
    }
    Ok(())
}

/// Which of the family's ops this backend runs. `mat_mul_add` and `glu_mat_mul` run for one
/// activation row (a decode step): the mat-vec adds the residual as it writes
/// (`shaders/mat_mul_vec.wgsl`), and a GLU is its own pass before it. For more rows, and
/// for `rms_norm_mat_mul` (see the shader's note), the executor composes them from the plain
/// ops.
pub(super) fn supports_op(dev: &Device, op: &MatMulOp, d: &OpDesc) -> bool {
    // The plain matmul of one row `x` by `w` into `y`, through the mat-vec (rows a multiple
    // of 32), and the other activations (residual, GLU inputs) f32, each within one binding.
    let decode = |x: &TensorDesc, w: &TensorDesc, y: &TensorDesc, more: &[&TensorDesc]| {
        let plain = OpDesc::new(
            Op::MatMul(MatMulOp::MatMul),
            vec![x.clone(), w.clone()],
            vec![y.clone()],
        );
        let k = w.shape.last();
        k % 32 == 0
            && x.shape.numel() == k
            && kernels::mat_vec(w.dtype).is_some()
            && supports(dev, &plain)
            && more.iter().all(|t| {
                t.dtype == DType::F32 && dev.fits_binding(t.nbytes().unwrap_or(usize::MAX))
            })
    };
    let (i, y) = (&d.inputs, &d.outputs[0]);
    match op {
        MatMulOp::MatMul => supports(dev, d),
        MatMulOp::MatMulAdd => decode(&i[0], &i[1], y, &[&i[2]]),
        MatMulOp::GluMatMul(g) => {
            let glu = ElementwiseOp::Glu(*g);
            let glu_desc = OpDesc::new(
                Op::Elementwise(glu.clone()),
                vec![i[0].clone(), i[1].clone()],
                vec![i[0].clone()],
            );
            let more: Vec<&TensorDesc> = i[1..2].iter().chain(i.get(3)).collect();
            decode(&i[0], &i[2], y, &more) && super::elementwise::supports_op(dev, &glu, &glu_desc)
        }
        MatMulOp::RmsNormMatMul { .. } => false,
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &MatMulOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        MatMulOp::MatMul => mat_mul(dev, i[0], i[1], o[0]),
        MatMulOp::MatMulAdd => mat_mul_r(dev, i[0], i[1], Some(i[2]), o[0]),
        MatMulOp::GluMatMul(g) => {
            // The GLU in its own pass (folded into the mat-vec, every workgroup would take each
            // activation's exp again), then the mat-vec with the residual, if any, added.
            let h = dev.alloc(i[0].desc())?;
            super::elementwise::run_op(dev, &ElementwiseOp::Glu(*g), &[i[0], i[1]], &[&h])?;
            mat_mul_r(dev, &h, i[2], i.get(3).copied(), o[0])
        }
        other => Err(super::no_kernel(&Op::MatMul(other.clone()))),
    }
}
