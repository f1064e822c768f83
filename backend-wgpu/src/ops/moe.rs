//! MoE routing and matmul by expert id.

use kiln_core::op::{MoeGating, MoeOp, OpDesc};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{all_fit, bind, err, f32_all, launch_1d, u};
use crate::device::{fold, Device};
use crate::kernels::{self, plain, ranked, Kernel};

const MOE: &str = include_str!("../../../shaders/moe.wgsl");
const MOE_SUM: &str = include_str!("../../../shaders/moe_sum.wgsl");

ranked!(MOE_ROUTE_F32, "moe_route_f32", "moe", MOE);
plain!(MOE_SUM_F32, "moe_sum_f32", "moe_sum", MOE_SUM);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&MOE_ROUTE_F32, &MOE_SUM_F32];

pub(super) fn route(
    dev: &Device,
    k: usize,
    gating: MoeGating,
    normalize: bool,
    logits: &Tensor,
    o: &[&Tensor],
) -> Result<()> {
    let (t, e) = (logits.shape().dims()[0], logits.shape().dims()[1]);
    let (bound, offs) = bind(dev, &[(logits, 4), (o[0], 4), (o[1], 4)])?;
    let params = vec![
        u(t)?,
        u(e)?,
        u(k)?,
        (gating == MoeGating::Sigmoid) as u32,
        normalize as u32,
        offs[0],
        offs[1],
        offs[2],
    ];
    launch_1d(dev, &MOE_ROUTE_F32, &bound, params, t.div_ceil(64))
}

/// `out[t] = Σᵢ w[t, i]·y[t, i]`.
pub(super) fn sum(dev: &Device, y: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    let d = y.shape().dims();
    let (t, k, n) = (d[0], d[1], d[2]);
    let (bound, offs) = bind(dev, &[(y, 4), (w, 4), (out, 4)])?;
    let params = vec![u(t)?, u(k)?, u(n)?, offs[0], offs[1], offs[2]];
    launch_1d(dev, &MOE_SUM_F32, &bound, params, (t * n).div_ceil(64))
}

pub(super) fn supports_mat_mul_id(dev: &Device, d: &OpDesc) -> bool {
    let fits =
        |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    let w = &d.inputs[1];
    d.inputs[0].dtype == DType::F32
        && d.outputs[0].dtype == DType::F32
        && kernels::mat_mul_id(w.dtype).is_some()
        && (w.dtype.block_size() == 1 || w.shape.last() % 32 == 0)
        && d.inputs.iter().chain(&d.outputs).all(fits)
        && d.inputs[2].numel() <= dev.limits.max_compute_workgroups_per_dimension as usize
}

pub(super) fn mat_mul_id(
    dev: &Device,
    x: &Tensor,
    w: &Tensor,
    ids: &Tensor,
    y: &Tensor,
) -> Result<()> {
    let kernel = kernels::mat_mul_id(w.dtype())
        .ok_or_else(|| err(format!("mat_mul_id: no kernel for {} weights", w.dtype())))?;
    let wd = w.shape().dims();
    let (ne, n, kdim) = (wd[0], wd[1], wd[2]);
    let (t, k) = (ids.shape().dims()[0], ids.shape().dims()[1]);
    let per_slot = x.numel() == t * k * kdim && k > 1;
    let w_row = w.nbytes() / (ne * n).max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (w, 1), (ids, 4), (y, 4)])?;
    let (gx, gz) = fold(
        u(n.div_ceil(4))?,
        dev.limits.max_compute_workgroups_per_dimension,
    );
    let params = vec![
        u(t * k)?,
        u(k)?,
        per_slot as u32,
        u(n)?,
        u(kdim)?,
        u(ne)?,
        offs[0],
        offs[1],
        u(w_row)?,
        offs[2],
        offs[3],
        gx,
    ];
    dev.dispatch_bound(kernel, &bound, &params, [gx, u(t * k)?, gz])
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, op: &MoeOp, d: &OpDesc) -> bool {
    let (i, o) = (&d.inputs, &d.outputs);
    match op {
        MoeOp::MatMulId => supports_mat_mul_id(dev, d),
        MoeOp::MoeRoute { .. } => i[0].dtype == DType::F32 && all_fit(dev, d),
        MoeOp::MoeSum => f32_all(i) && f32_all(o) && all_fit(dev, d),
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &MoeOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        MoeOp::MatMulId => mat_mul_id(dev, i[0], i[1], i[2], o[0]),
        MoeOp::MoeSum => sum(dev, i[0], i[1], o[0]),
        MoeOp::MoeRoute {
            k,
            gating,
            normalize,
        } => route(dev, *k, *gating, *normalize, i[0], o),
    }
}
