//! Launchers, one file per op family (the same stems as `core/src/cpu/` and `shaders/`),
//! and the one place that says which ops this backend runs.

mod attention;
mod canvas;
mod conv;
mod delta_net;
mod elementwise;
mod get_rows;
mod mat_mul;
mod moe;
mod norm;
mod reduce;
mod rope;
mod softmax;

pub(crate) use elementwise::patch_word;

use kiln_core::op::{Op, OpDesc};
use kiln_core::tensor::{DType, Tensor, TensorDesc};
use kiln_core::{Error, Result};

use crate::device::{fold, Bound, Device};
use crate::kernels::Kernel;

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::backend("wgpu", msg)
}

/// Whether this backend runs `desc`: exactly the ops, dtypes and shapes its kernels pass the
/// conformance suite for, as each family's file says. Everything else falls back to the CPU
/// through the executor.
pub(crate) fn supports(dev: &Device, desc: &OpDesc) -> bool {
    if desc.check().is_err() {
        return false;
    }
    match &desc.op {
        Op::MatMul(f) => mat_mul::supports_op(dev, f, desc),
        Op::GetRows(f) => get_rows::supports_op(dev, f, desc),
        Op::Elementwise(f) => elementwise::supports_op(dev, f, desc),
        Op::Norm(f) => norm::supports_op(dev, f, desc),
        Op::Rope(f) => rope::supports_op(dev, f, desc),
        Op::Softmax(f) => softmax::supports_op(dev, f, desc),
        Op::Attention(f) => attention::supports_op(dev, f, desc),
        Op::Reduce(f) => reduce::supports_op(dev, f, desc),
        Op::Conv(f) => conv::supports_op(dev, f, desc),
        Op::DeltaNet(f) => delta_net::supports_op(dev, f, desc),
        Op::Moe(f) => moe::supports_op(dev, f, desc),
        Op::Canvas(f) => canvas::supports_op(dev, f, desc),
    }
}

/// Records `op` (already checked by the caller) with its family's launcher.
pub(crate) fn execute(dev: &Device, op: &Op, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        Op::MatMul(f) => mat_mul::run_op(dev, f, i, o),
        Op::GetRows(f) => get_rows::run_op(dev, f, i, o),
        Op::Elementwise(f) => elementwise::run_op(dev, f, i, o),
        Op::Norm(f) => norm::run_op(dev, f, i, o),
        Op::Rope(f) => rope::run_op(dev, f, i, o),
        Op::Softmax(f) => softmax::run_op(dev, f, i, o),
        Op::Attention(f) => attention::run_op(dev, f, i, o),
        Op::Reduce(f) => reduce::run_op(dev, f, i, o),
        Op::Conv(f) => conv::run_op(dev, f, i, o),
        Op::DeltaNet(f) => delta_net::run_op(dev, f, i, o),
        Op::Moe(f) => moe::run_op(dev, f, i, o),
        Op::Canvas(f) => canvas::run_op(dev, f, i, o),
    }
}

/// The kernels of no weight format, family by family (each family's file declares its own).
pub(crate) fn plain_kernels() -> impl Iterator<Item = &'static Kernel> {
    [
        elementwise::KERNELS,
        norm::KERNELS,
        rope::KERNELS,
        softmax::KERNELS,
        attention::KERNELS,
        reduce::KERNELS,
        conv::KERNELS,
        delta_net::KERNELS,
        moe::KERNELS,
        canvas::KERNELS,
    ]
    .into_iter()
    .flatten()
    .copied()
}

/// The error for an op a family's file has no kernel for (its `supports_op` says no, so the
/// executor runs it on the CPU and never asks).
pub(crate) fn no_kernel(op: &Op) -> Error {
    err(format!(
        "{} has no WebGPU kernel (supports_op says no; the executor runs it on the CPU)",
        op.name()
    ))
}

/// Every tensor of `ts` is f32.
pub(crate) fn f32_all(ts: &[TensorDesc]) -> bool {
    ts.iter().all(|t| t.dtype == DType::F32)
}

/// Every operand fits one storage binding (a split weight or table aside, which the
/// families that take them check themselves).
pub(crate) fn all_fit(dev: &Device, d: &OpDesc) -> bool {
    d.inputs
        .iter()
        .chain(&d.outputs)
        .all(|t| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX)))
}

/// Binds `tensors` and returns the bindings with each tensor's offset in `unit`-byte elements
/// (4 for f32/i32/u32 words, 1 for byte-addressed weights).
pub(crate) fn bind<'a>(
    dev: &Device,
    tensors: &[(&'a Tensor, u32)],
) -> Result<(Vec<Bound<'a>>, Vec<u32>)> {
    let mut bound = Vec::with_capacity(tensors.len());
    let mut offs = Vec::with_capacity(tensors.len());
    for (t, unit) in tensors {
        let b = dev.bind(t)?;
        if b.byte_off % unit != 0 {
            return Err(err(format!(
                "{} starts at byte {} of its buffer, not on a {unit}-byte boundary",
                t.desc(),
                t.offset()
            )));
        }
        offs.push(b.byte_off / unit);
        bound.push(b);
    }
    Ok((bound, offs))
}

/// Records a 1-D launch of `groups` workgroups, folded over x and y; the kernel's `nx`
/// parameter (the last word of `params`) is filled in here.
pub(crate) fn launch_1d(
    dev: &Device,
    k: &Kernel,
    bound: &[Bound<'_>],
    mut params: Vec<u32>,
    groups: usize,
) -> Result<()> {
    let groups = u32::try_from(groups).map_err(|_| err(format!("{}: grid too large", k.entry)))?;
    let (x, y) = fold(groups, dev.limits.max_compute_workgroups_per_dimension);
    params.push(x);
    dev.dispatch_bound(k, bound, &params, [x, y, 1])
}

/// A u32 launch parameter from a size, or an error when it does not fit.
pub(crate) fn u(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| err(format!("size {n} does not fit a 32-bit kernel parameter")))
}
