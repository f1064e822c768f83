//! Block diffusion's canvas ops: the draw (a workgroup per row) and the acceptance (one
//! workgroup for the canvas).

use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{bind, launch_1d, u};
use crate::device::Device;
use crate::kernels;

pub(super) fn draw(dev: &Device, scale: f32, seed: u64, x: &Tensor, o: &[&Tensor]) -> Result<()> {
    let n = x.shape().last();
    let rows = x.numel() / n.max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (o[0], 4), (o[1], 4), (o[2], 4), (o[3], 4)])?;
    let params = vec![
        u(rows)?,
        u(n)?,
        offs[0],
        offs[1],
        offs[2],
        offs[3],
        offs[4],
        scale.to_bits(),
        seed as u32,
        (seed >> 32) as u32,
    ];
    launch_1d(dev, &kernels::CANVAS_DRAW_F32, &bound, params, rows)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn accept(
    dev: &Device,
    bound_: f32,
    confidence: f32,
    stability: usize,
    vocab: usize,
    seed: u64,
    i: &[&Tensor],
    o: &[&Tensor],
) -> Result<()> {
    let t = i[0].numel();
    let (bound, offs) = bind(
        dev,
        &[
            (i[0], 4),
            (i[1], 4),
            (i[2], 4),
            (o[0], 4),
            (o[1], 4),
            (o[2], 4),
        ],
    )?;
    let params = vec![
        u(t)?,
        u(stability)?,
        u(vocab)?,
        bound_.to_bits(),
        confidence.to_bits(),
        seed as u32,
        (seed >> 32) as u32,
        offs[0],
        offs[1],
        offs[2],
        offs[3],
        offs[4],
        offs[5],
    ];
    launch_1d(dev, &kernels::CANVAS_ACCEPT_I32, &bound, params, 1)
}
