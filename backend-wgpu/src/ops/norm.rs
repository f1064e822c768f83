//! RMS norm, L2 norm and LayerNorm: one workgroup per row.

use kiln_core::op::{NormOp, OpDesc};
use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{all_fit, bind, f32_all, launch_1d, u};
use crate::device::Device;
use crate::kernels::{plain, Kernel};

const NORM: &str = include_str!("../../../shaders/norm.wgsl");
const NORM_LAYER: &str = include_str!("../../../shaders/norm_layer.wgsl");

plain!(RMS_NORM_F32, "rms_norm_f32", "norm", NORM);
plain!(L2_NORM_F32, "l2_norm_f32", "norm", NORM);
plain!(LAYER_NORM_F32, "layer_norm_f32", "norm_layer", NORM_LAYER);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&RMS_NORM_F32, &L2_NORM_F32, &LAYER_NORM_F32];

pub(super) fn rms_norm(
    dev: &Device,
    x: &Tensor,
    w: &Tensor,
    y: &Tensor,
    eps: f32,
    one_plus: bool,
) -> Result<()> {
    let d = x.shape().last();
    let rows = x.numel() / d.max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (w, 4), (y, 4)])?;
    let params = vec![
        u(rows)?,
        u(d)?,
        offs[0],
        offs[1],
        offs[2],
        eps.to_bits(),
        one_plus as u32,
    ];
    launch_1d(dev, &RMS_NORM_F32, &bound, params, rows)
}

pub(super) fn l2_norm(dev: &Device, x: &Tensor, y: &Tensor, eps: f32) -> Result<()> {
    let d = x.shape().last();
    let rows = x.numel() / d.max(1);
    // The kernel's `w` binding is unused by l2_norm; `x` stands in.
    let (bound, offs) = bind(dev, &[(x, 4), (x, 4), (y, 4)])?;
    let params = vec![u(rows)?, u(d)?, offs[0], 0, offs[2], eps.to_bits(), 0];
    launch_1d(dev, &L2_NORM_F32, &bound, params, rows)
}

pub(super) fn layer_norm(dev: &Device, i: &[&Tensor], y: &Tensor, eps: f32) -> Result<()> {
    let x = i[0];
    let d = x.shape().last();
    let rows = x.numel() / d.max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (i[1], 4), (i[2], 4), (y, 4)])?;
    let params = vec![
        u(rows)?,
        u(d)?,
        offs[0],
        offs[1],
        offs[2],
        offs[3],
        eps.to_bits(),
    ];
    launch_1d(dev, &LAYER_NORM_F32, &bound, params, rows)
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, _op: &NormOp, d: &OpDesc) -> bool {
    f32_all(&d.inputs) && f32_all(&d.outputs) && all_fit(dev, d)
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &NormOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        NormOp::RmsNorm { eps, one_plus } => rms_norm(dev, i[0], i[1], o[0], *eps, *one_plus),
        NormOp::L2Norm { eps } => l2_norm(dev, i[0], o[0], *eps),
        NormOp::LayerNorm { eps } => layer_norm(dev, i, o[0], *eps),
    }
}
