//! Launchers, one file per op family (the same stems as `core/src/cpu/` and `shaders/`),
//! and the one place that says which ops this backend runs.

mod attention;
mod canvas;
mod conv;
mod delta_net;
mod elementwise;
mod get_rows;
mod matmul;
mod moe;
mod norm;
mod reduce;
mod rope;
mod softmax;

use kiln_core::op::{Op, OpDesc};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::{Error, Result};

use crate::device::{fold, Bound, Device};
use crate::kernels::Kernel;

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::backend("wgpu", msg)
}

/// Whether this backend runs `desc`: exactly the ops, dtypes and shapes its kernels pass the
/// conformance suite for. Everything else falls back to the CPU through the executor.
pub(crate) fn supports(dev: &Device, desc: &OpDesc) -> bool {
    if desc.check().is_err() {
        return false;
    }
    let (i, o) = (&desc.inputs, &desc.outputs);
    let f32_all = |ts: &[kiln_core::tensor::TensorDesc]| ts.iter().all(|t| t.dtype == DType::F32);
    // Every operand but a split weight or table must fit one storage binding.
    let fits =
        |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    match &desc.op {
        Op::MatMul => matmul::supports(dev, desc),
        Op::GetRows => get_rows::supports(dev, desc),
        Op::Add | Op::Mul | Op::Scale(_) | Op::Unary(_) | Op::Glu(_) => {
            f32_all(i) && f32_all(o) && i.iter().chain(o).all(fits)
        }
        Op::RmsNorm { .. } | Op::L2Norm { .. } | Op::Softmax { .. } => {
            f32_all(i) && f32_all(o) && i.iter().chain(o).all(fits)
        }
        Op::Rope(p) => {
            i[0].dtype == DType::F32
                && o[0].dtype == DType::F32
                && i.get(2).is_none_or(|f| f.dtype == DType::F32)
                && p.n_rot % 2 == 0
                && p.n_rot <= 2 * rope::MAX_PAIRS
                && i.iter().chain(o).all(fits)
        }
        Op::PagedAttention(_) | Op::Attention(_) => attention::supports(dev, desc),
        Op::KvWrite => attention::supports_kv_write(dev, desc),
        Op::Argmax | Op::TopK(_) => i[0].dtype == DType::F32 && i.iter().chain(o).all(fits),
        Op::Copy => i[0].nbytes().is_some_and(|n| n % 4 == 0) && i.iter().chain(o).all(fits),
        Op::Cast => {
            let same = i[0].dtype == o[0].dtype && i[0].nbytes().is_some_and(|n| n % 4 == 0);
            let widen = matches!(i[0].dtype, DType::F32 | DType::F16 | DType::BF16)
                && o[0].dtype == DType::F32;
            (same || widen) && i.iter().chain(o).all(fits)
        }
        Op::MatMulId => moe::supports_mat_mul_id(dev, desc),
        Op::MoeRoute { .. } => i[0].dtype == DType::F32 && i.iter().chain(o).all(fits),
        Op::MoeSum => f32_all(i) && f32_all(o) && i.iter().chain(o).all(fits),
        Op::Conv1d { .. } => {
            f32_all(i.get(..3).unwrap_or(&[])) && f32_all(o) && i.iter().chain(o).all(fits)
        }
        // The recurrent kernel computes the same function the chunked (WY) form does, so it
        // answers for both.
        Op::DeltaNet { .. } => {
            f32_all(i.get(..6).unwrap_or(&[]))
                && f32_all(o)
                && dev.limits.max_storage_buffers_per_shader_stage >= delta_net::BINDINGS
                && i.iter().chain(o).all(fits)
        }
        Op::CanvasDraw { .. } => i.iter().chain(o).all(fits),
        Op::CanvasAccept { .. } => {
            dev.limits.max_storage_buffers_per_shader_stage >= 7 && i.iter().chain(o).all(fits)
        }
        // Fused ops are CUDA's: WebGPU models take the decomposed path through the gate.
        Op::RmsNormMatMul { .. }
        | Op::GluMatMul(_)
        | Op::MatMulAdd
        | Op::DeltaNetDecode { .. }
        | Op::Conv1dDecode { .. }
        | Op::SoftEmbedding { .. } => false,
    }
}

/// Records `op` (already checked by the caller).
pub(crate) fn execute(dev: &Device, op: &Op, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        Op::MatMul => matmul::mat_mul(dev, i[0], i[1], o[0]),
        Op::GetRows => get_rows::get_rows(dev, i[0], i[1], o[0]),
        Op::Add | Op::Mul | Op::Scale(_) | Op::Unary(_) | Op::Glu(_) => {
            elementwise::run(dev, op, i, o[0])
        }
        Op::Copy | Op::Cast => elementwise::copy(dev, i[0], o[0]),
        Op::RmsNorm { eps, one_plus } => norm::rms_norm(dev, i[0], i[1], o[0], *eps, *one_plus),
        Op::L2Norm { eps } => norm::l2_norm(dev, i[0], o[0], *eps),
        Op::Rope(p) => rope::rope(dev, p, i, o[0]),
        Op::Softmax { scale, soft_cap } => softmax::softmax(dev, *scale, *soft_cap, i, o[0]),
        Op::PagedAttention(p) => attention::paged_attention(dev, p, i, o[0]),
        Op::KvWrite => attention::kv_write(dev, i, o),
        Op::Argmax => reduce::argmax(dev, i[0], o[0]),
        Op::MatMulId => moe::mat_mul_id(dev, i[0], i[1], i[2], o[0]),
        Op::MoeSum => moe::sum(dev, i[0], i[1], o[0]),
        Op::MoeRoute {
            k,
            gating,
            normalize,
        } => moe::route(dev, *k, *gating, *normalize, i[0], o),
        Op::Attention(p) => attention::attention(dev, p, i, o[0]),
        Op::Conv1d { silu } => conv::conv1d(dev, *silu, i, o),
        Op::DeltaNet { scale, .. } => delta_net::delta_net(dev, *scale, i, o),
        Op::TopK(k) => reduce::top_k(dev, *k, i[0], o[0], o[1]),
        Op::CanvasDraw { scale, seed } => canvas::draw(dev, *scale, *seed, i[0], o),
        Op::CanvasAccept {
            entropy_bound,
            confidence,
            stability,
            vocab,
            seed,
        } => canvas::accept(
            dev,
            *entropy_bound,
            *confidence,
            *stability,
            *vocab,
            *seed,
            i,
            o,
        ),
        other => Err(err(format!(
            "{} has no WebGPU kernel (supports_op says no; the executor runs it on the CPU)",
            other.name()
        ))),
    }
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
