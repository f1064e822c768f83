//! Row softmax with scale, soft cap and an optional additive mask.

use kiln_core::op::{OpDesc, SoftmaxOp};
use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{all_fit, bind, f32_all, launch_1d, u};
use crate::device::Device;
use crate::kernels::{plain, Kernel};

const SOFTMAX: &str = include_str!("../../../shaders/softmax.wgsl");

plain!(SOFTMAX_F32, "softmax_f32", "softmax", SOFTMAX);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&SOFTMAX_F32];

pub(super) fn softmax(
    dev: &Device,
    scale: f32,
    soft_cap: Option<f32>,
    i: &[&Tensor],
    y: &Tensor,
) -> Result<()> {
    let x = i[0];
    let mask = i.get(1).copied();
    let n = x.shape().last();
    let rows = x.numel() / n.max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (mask.unwrap_or(x), 4), (y, 4)])?;
    let m_rows = mask.map_or(0, |m| m.numel() / n.max(1));
    let params = vec![
        u(rows)?,
        u(n)?,
        offs[0],
        offs[1],
        u(m_rows)?,
        offs[2],
        scale.to_bits(),
        soft_cap.unwrap_or(0.0).to_bits(),
    ];
    launch_1d(dev, &SOFTMAX_F32, &bound, params, rows)
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, _op: &SoftmaxOp, d: &OpDesc) -> bool {
    f32_all(&d.inputs) && f32_all(&d.outputs) && all_fit(dev, d)
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &SoftmaxOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        SoftmaxOp::Softmax { scale, soft_cap } => softmax(dev, *scale, *soft_cap, i, o[0]),
    }
}
