//! Argmax and top-k: one workgroup per row.

use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{bind, launch_1d, u};
use crate::device::Device;
use crate::kernels;

pub(super) fn argmax(dev: &Device, x: &Tensor, idx: &Tensor) -> Result<()> {
    let n = x.shape().last();
    let rows = x.numel() / n.max(1);
    // The values binding is unused by argmax; the dummy stands in.
    let (bound, offs) = bind(dev, &[(x, 4), (&dev.dummy, 4), (idx, 4)])?;
    let params = vec![u(rows)?, u(n)?, 1, offs[0], 0, offs[2]];
    launch_1d(dev, &kernels::ARGMAX_F32, &bound, params, rows)
}

pub(super) fn top_k(dev: &Device, k: usize, x: &Tensor, vals: &Tensor, idx: &Tensor) -> Result<()> {
    let n = x.shape().last();
    let rows = x.numel() / n.max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (vals, 4), (idx, 4)])?;
    let params = vec![u(rows)?, u(n)?, u(k)?, offs[0], offs[1], offs[2]];
    launch_1d(dev, &kernels::TOP_K_F32, &bound, params, rows)
}
