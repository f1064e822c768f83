//! Block diffusion's canvas ops: the draw (a workgroup per row) and the acceptance (one
//! workgroup for the canvas).

use kiln_core::op::{CanvasOp, OpDesc};
use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{all_fit, bind, launch_1d, u};
use crate::device::Device;
use crate::kernels::{self, Kernel};

const CANVAS: &str = include_str!("../../../shaders/canvas.wgsl");
const CANVAS_ACCEPT: &str = include_str!("../../../shaders/canvas_accept.wgsl");

pub const CANVAS_DRAW_F32: Kernel = Kernel {
    entry: "canvas_draw_f32",
    file: "canvas",
    source: CANVAS,
    commons: &[kernels::ORDER, kernels::CANVAS_HASH],
    subst: &[],
};
pub const CANVAS_ACCEPT_I32: Kernel = Kernel {
    entry: "canvas_accept",
    file: "canvas_accept",
    source: CANVAS_ACCEPT,
    commons: &[kernels::CANVAS_HASH],
    subst: &[],
};

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&CANVAS_DRAW_F32, &CANVAS_ACCEPT_I32];

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
    launch_1d(dev, &CANVAS_DRAW_F32, &bound, params, rows)
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
    launch_1d(dev, &CANVAS_ACCEPT_I32, &bound, params, 1)
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, op: &CanvasOp, d: &OpDesc) -> bool {
    match op {
        CanvasOp::CanvasDraw { .. } => all_fit(dev, d),
        CanvasOp::CanvasAccept { .. } => {
            dev.limits.max_storage_buffers_per_shader_stage >= 7 && all_fit(dev, d)
        }
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &CanvasOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        CanvasOp::CanvasDraw { scale, seed } => draw(dev, *scale, *seed, i[0], o),
        CanvasOp::CanvasAccept {
            entropy_bound,
            confidence,
            stability,
            vocab,
            seed,
        } => accept(
            dev,
            *entropy_bound,
            *confidence,
            *stability,
            *vocab,
            *seed,
            i,
            o,
        ),
    }
}
