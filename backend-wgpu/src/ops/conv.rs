//! Causal depthwise conv1d with carried state: the outputs, then the new state.

use kiln_core::tensor::Tensor;
use kiln_core::Result;

use super::{bind, launch_1d, u};
use crate::device::Device;
use crate::kernels;

pub(super) fn conv1d(dev: &Device, silu: bool, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    let (x, w, state, seq_start) = (i[0], i[1], i[2], i[3]);
    let (t, c) = (x.shape().dims()[0], x.shape().dims()[1]);
    let kw = w.shape().dims()[1];
    let n_seqs = seq_start.numel() - 1;
    for (kernel, out, n) in [
        (&kernels::CONV1D_F32, o[0], t * c),
        (&kernels::CONV1D_STATE_F32, o[1], n_seqs * (kw - 1) * c),
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
