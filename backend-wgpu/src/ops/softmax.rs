//! Row softmax with scale, soft cap and an optional additive mask.

use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{bind, launch_1d, u};
use crate::device::Device;
use crate::kernels;

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
    launch_1d(dev, &kernels::SOFTMAX_F32, &bound, params, rows)
}
