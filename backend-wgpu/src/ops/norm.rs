//! RMS norm and L2 norm: one workgroup per row.

use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{bind, launch_1d, u};
use crate::device::Device;
use crate::kernels;

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
    launch_1d(dev, &kernels::RMS_NORM_F32, &bound, params, rows)
}

pub(super) fn l2_norm(dev: &Device, x: &Tensor, y: &Tensor, eps: f32) -> Result<()> {
    let d = x.shape().last();
    let rows = x.numel() / d.max(1);
    // The kernel's `w` binding is unused by l2_norm; `x` stands in.
    let (bound, offs) = bind(dev, &[(x, 4), (x, 4), (y, 4)])?;
    let params = vec![u(rows)?, u(d)?, offs[0], 0, offs[2], eps.to_bits(), 0];
    launch_1d(dev, &kernels::L2_NORM_F32, &bound, params, rows)
}
