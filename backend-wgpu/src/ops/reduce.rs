//! Argmax and top-k: one workgroup per row.

use kiln_core::op::{OpDesc, ReduceOp};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{all_fit, bind, launch_1d, u};
use crate::device::Device;
use crate::kernels::{ranked, Kernel};

const REDUCE: &str = include_str!("../../../shaders/reduce.wgsl");

ranked!(ARGMAX_F32, "argmax_f32", "reduce", REDUCE);
ranked!(TOP_K_F32, "top_k_f32", "reduce", REDUCE);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&ARGMAX_F32, &TOP_K_F32];

pub(super) fn argmax(dev: &Device, x: &Tensor, idx: &Tensor) -> Result<()> {
    let n = x.shape().last();
    let rows = x.numel() / n.max(1);
    // The values binding is unused by argmax; the dummy stands in.
    let (bound, offs) = bind(dev, &[(x, 4), (&dev.dummy, 4), (idx, 4)])?;
    let params = vec![u(rows)?, u(n)?, 1, offs[0], 0, offs[2]];
    launch_1d(dev, &ARGMAX_F32, &bound, params, rows)
}

pub(super) fn top_k(dev: &Device, k: usize, x: &Tensor, vals: &Tensor, idx: &Tensor) -> Result<()> {
    let n = x.shape().last();
    let rows = x.numel() / n.max(1);
    let (bound, offs) = bind(dev, &[(x, 4), (vals, 4), (idx, 4)])?;
    let params = vec![u(rows)?, u(n)?, u(k)?, offs[0], offs[1], offs[2]];
    launch_1d(dev, &TOP_K_F32, &bound, params, rows)
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, _op: &ReduceOp, d: &OpDesc) -> bool {
    d.inputs[0].dtype == DType::F32 && all_fit(dev, d)
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &ReduceOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        ReduceOp::Argmax => argmax(dev, i[0], o[0]),
        ReduceOp::TopK(k) => top_k(dev, *k, i[0], o[0], o[1]),
    }
}
