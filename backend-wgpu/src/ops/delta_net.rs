//! The Gated DeltaNet recurrence, non-fused: one thread per state column.

use kiln_core::op::{DeltaNetOp, Op, OpDesc};
use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{all_fit, bind, f32_all, u};
use crate::device::{fold, Device};
use crate::kernels::{plain, Kernel};

const DELTA_NET: &str = include_str!("../../../shaders/delta_net.wgsl");

plain!(DELTA_NET_F32, "delta_net_f32", "delta_net", DELTA_NET);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&DELTA_NET_F32];

/// Storage bindings the kernel needs (nine tensors and its parameters).
pub(super) const BINDINGS: u32 = 10;

pub(super) fn delta_net(dev: &Device, scale: f32, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    let (q, k, v, g, beta, state, seq_start) = (i[0], i[1], i[2], i[3], i[4], i[5], i[6]);
    let (hk, dk) = (q.shape().dims()[1], q.shape().dims()[2]);
    let (hv, dv) = (v.shape().dims()[1], v.shape().dims()[2]);
    let n_seqs = seq_start.numel() - 1;
    let (bound, offs) = bind(
        dev,
        &[
            (q, 4),
            (k, 4),
            (v, 4),
            (g, 4),
            (beta, 4),
            (state, 4),
            (seq_start, 4),
            (o[0], 4),
            (o[1], 4),
        ],
    )?;
    let (gx, gz) = fold(
        u(n_seqs * hv)?,
        dev.limits.max_compute_workgroups_per_dimension,
    );
    let mut params = vec![u(hk)?, u(hv)?, u(dk)?, u(dv)?, u(n_seqs)?];
    params.extend_from_slice(&offs);
    params.push(scale.to_bits());
    params.push(gx);
    dev.dispatch_bound(
        &DELTA_NET_F32,
        &bound,
        &params,
        [gx, u(dv.div_ceil(64))?, gz],
    )
}

/// Which of the family's ops this backend runs. The recurrent kernel computes the same
/// function the chunked (WY) form does, so it answers for both; the decode step on a state
/// pool is CUDA's fusion.
pub(super) fn supports_op(dev: &Device, op: &DeltaNetOp, d: &OpDesc) -> bool {
    match op {
        DeltaNetOp::DeltaNet { .. } => {
            f32_all(d.inputs.get(..6).unwrap_or(&[]))
                && f32_all(&d.outputs)
                && dev.limits.max_storage_buffers_per_shader_stage >= BINDINGS
                && all_fit(dev, d)
        }
        DeltaNetOp::DeltaNetDecode { .. } => false,
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &DeltaNetOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        DeltaNetOp::DeltaNet { scale, .. } => delta_net(dev, *scale, i, o),
        other => Err(super::no_kernel(&Op::DeltaNet(other.clone()))),
    }
}
