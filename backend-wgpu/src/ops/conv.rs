//! Causal depthwise conv1d with carried state: the outputs, then the new state.

use kiln_core::op::{ConvOp, Op, OpDesc};
use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{all_fit, bind, f32_all, launch_1d, u};
use crate::device::Device;
use crate::kernels::{plain, Kernel};

const CONV: &str = include_str!("../../../shaders/conv.wgsl");

plain!(CONV1D_F32, "conv1d_f32", "conv", CONV);
plain!(CONV1D_STATE_F32, "conv1d_state_f32", "conv", CONV);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&CONV1D_F32, &CONV1D_STATE_F32];

pub(super) fn conv1d(dev: &Device, silu: bool, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    let (x, w, state, seq_start) = (i[0], i[1], i[2], i[3]);
    let (t, c) = (x.shape().dims()[0], x.shape().dims()[1]);
    let kw = w.shape().dims()[1];
    let n_seqs = seq_start.numel() - 1;
    for (kernel, out, n) in [
        (&CONV1D_F32, o[0], t * c),
        (&CONV1D_STATE_F32, o[1], n_seqs * (kw - 1) * c),
    ] {
        let (bound, offs) = bind(dev, &[(x, 4), (w, 4), (state, 4), (seq_start, 4), (out, 4)])?;
        let params = vec![
            u(t)?,
            u(c)?,
            u(kw)?,
            u(n_seqs)?,
            offs[0],
            offs[1],
            offs[2],
            offs[3],
            offs[4],
            silu as u32,
        ];
        launch_1d(dev, kernel, &bound, params, n.div_ceil(256))?;
    }
    Ok(())
}

/// Which of the family's ops this backend runs. The decode step on a state pool is CUDA's
/// fusion: WebGPU models take the composed path.
pub(super) fn supports_op(dev: &Device, op: &ConvOp, d: &OpDesc) -> bool {
    match op {
        ConvOp::Conv1d { .. } => {
            f32_all(d.inputs.get(..3).unwrap_or(&[])) && f32_all(&d.outputs) && all_fit(dev, d)
        }
        ConvOp::Conv1dDecode { .. } => false,
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &ConvOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        ConvOp::Conv1d { silu } => conv1d(dev, *silu, i, o),
        other => Err(super::no_kernel(&Op::Conv(other.clone()))),
    }
}
