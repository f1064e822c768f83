//! Rotary position embedding. The per-pair inverse frequencies are computed here exactly as
//! the CPU reference computes them and passed with the launch parameters.

use kiln_core::op::{RopeMode, RopeParams};
use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{bind, u};
use crate::device::Device;
use crate::kernels;

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
    dev.dispatch_bound(&kernels::ROPE_F32, &bound, &params, [gx, gy, 1])
}
