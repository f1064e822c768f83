//! Rotary position embedding. The per-pair inverse frequencies are computed here exactly as
//! the CPU reference computes them and passed with the launch parameters.

use kiln_core::op::{OpDesc, RopeMode, RopeOp, RopeParams};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{all_fit, bind, u};
use crate::device::Device;
use crate::kernels::{plain, Kernel};

const ROPE: &str = include_str!("../../../shaders/rope.wgsl");

plain!(ROPE_F32, "rope_f32", "rope", ROPE);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&ROPE_F32];

/// Rotary pairs per head the parameter block carries.
pub(super) const MAX_PAIRS: usize = 1024;

pub(super) fn rope(dev: &Device, p: &RopeParams, i: &[&Tensor], y: &Tensor) -> Result<()> {
    let (x, pos) = (i[0], i[1]);
    let ff = i.get(2).copied();
    let dims = x.shape().dims();
    let (t, h, d) = (dims[0], dims[1], dims[2]);
    let half = p.n_rot / 2;
    let ff_t = ff.unwrap_or(&dev.dummy);
    let (bound, offs) = bind(dev, &[(x, 4), (pos, 4), (ff_t, 4), (y, 4)])?;
    let mut params = vec![
        u(t)?,
        u(h)?,
        u(d)?,
        u(p.n_rot)?,
        (p.mode == RopeMode::Neox) as u32,
        offs[0],
        offs[1],
        offs[2],
        ff.is_some() as u32,
        offs[3],
        p.freq_scale.to_bits(),
        p.attn_factor.to_bits(),
    ];
    let n = t * h * d;
    let groups = u(n.div_ceil(256))?;
    let (gx, gy) = crate::device::fold(groups, dev.limits.max_compute_workgroups_per_dimension);
    // The inverse-frequency table follows `nx` (the kernel's runtime-sized array).
    params.push(gx);
    params.extend((0..half.max(1)).map(|j| {
        // The CPU reference's formula, in f32.
        p.base.powf(-2.0 * j as f32 / p.n_rot as f32).to_bits()
    }));
    dev.dispatch_bound(&ROPE_F32, &bound, &params, [gx, gy, 1])
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, op: &RopeOp, d: &OpDesc) -> bool {
    let (i, o) = (&d.inputs, &d.outputs);
    let RopeOp::Rope(p) = op;
    i[0].dtype == DType::F32
        && o[0].dtype == DType::F32
        && i.get(2).is_none_or(|f| f.dtype == DType::F32)
        && p.n_rot % 2 == 0
        && p.n_rot <= 2 * MAX_PAIRS
        && all_fit(dev, d)
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &RopeOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        RopeOp::Rope(p) => rope(dev, p, i, o[0]),
    }
}
