//! The Gated DeltaNet family: the linear-attention recurrence of Qwen3.5's hybrid layers,
//! over a prompt and as one decode step against a state pool.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, TensorDesc};

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum DeltaNetOp {
    /// The Gated DeltaNet recurrence over a batch of sequences. `q [T, Hk, Dk]`, `k [T, Hk, Dk]`,
    /// `v [T, Hv, Dv]`, `g [T, Hv]` (log decay), `beta [T, Hv]`, `state [S, Hv, Dk, Dv]`,
    /// `seq_start [S + 1]` → `o [T, Hv, Dv]`, `state_out [S, Hv, Dk, Dv]`. `Hv` is a multiple
    /// of `Hk`. Per token: `St = e^g·S; St += k ⊗ β(v − Stᵀk); o = Stᵀ(q·scale)`.
    /// `chunk: Some(c)` asks for the chunked (WY) algorithm with chunks of `c` tokens: the same
    /// function, computed the way prefill kernels do.
    DeltaNet { scale: f32, chunk: Option<usize> },
    /// One Gated DeltaNet decode step per sequence, state gathered from and written back to a
    /// pool by slot. `q [S, Hk, Dk]`, `k`, `v [S, Hv, Dv]`, `g [S, Hv]`, `beta [S, Hv]`,
    /// `slots [S]` → `o [S, Hv, Dv]`, and output 1 `state_pool [P, Hv, Dk, Dv]` updated in
    /// place. With `qk_l2norm: Some(eps)` q and k are L2-normalised first.
    DeltaNetDecode { scale: f32, qk_l2norm: Option<f32> },
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for DeltaNetOp {
    fn default() -> Self {
        DeltaNetOp::DeltaNet {
            scale: 1.0,
            chunk: None,
        }
    }
}

impl Family for DeltaNetOp {
    fn name(&self) -> &'static str {
        match self {
            DeltaNetOp::DeltaNet { .. } => "delta_net",
            DeltaNetOp::DeltaNetDecode { .. } => "delta_net_decode",
        }
    }

    fn reads_outputs(&self) -> bool {
        matches!(self, DeltaNetOp::DeltaNetDecode { .. })
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        let chunk = match self {
            DeltaNetOp::DeltaNet { chunk, .. } => *chunk,
            DeltaNetOp::DeltaNetDecode { .. } => None,
        };
        let decode = self.reads_outputs();
        c.n_inputs(if decode { &[6] } else { &[7] })?;
        for (t, what) in i[..5].iter().zip(["q", "k", "v", "g", "beta"]) {
            c.float(t, what)?;
        }
        c.rank(&i[0], 3, "q")?;
        c.rank(&i[2], 3, "v")?;
        let q = c.dims(&i[0]);
        let v = c.dims(&i[2]);
        c.ensure(i[1].shape == i[0].shape, || "k must have q's shape".into())?;
        c.ensure(v[0] == q[0], || {
            "q and v must have the same token count".into()
        })?;
        c.ensure(q[1] > 0 && v[1] % q[1] == 0, || {
            format!(
                "value heads {} must be a multiple of key heads {}",
                v[1], q[1]
            )
        })?;
        c.ensure(
            i[3].shape.0 == [v[0], v[1]] && i[4].shape.0 == [v[0], v[1]],
            || format!("g and beta must be [{}, {}]", v[0], v[1]),
        )?;
        if decode {
            c.dtype(&i[5], DType::I32, "slots")?;
            c.ensure(i[5].shape.0 == [q[0]], || "slots must be [S]".into())
        } else {
            if let Some(ch) = chunk {
                c.ensure(ch >= 1, || "chunk size must be at least 1".into())?;
            }
            c.float(&i[5], "state")?;
            c.rank(&i[5], 4, "state")?;
            let s = i[5].shape.0[0];
            c.ensure(i[5].shape.0[1..] == [v[1], q[2], v[2]], || {
                format!("state must be [S, {}, {}, {}]", v[1], q[2], v[2])
            })?;
            c.dtype(&i[6], DType::I32, "seq_start")?;
            c.ensure(i[6].shape.0 == [s + 1], || {
                format!("seq_start must be [{}]", s + 1)
            })
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        match self {
            DeltaNetOp::DeltaNet { .. } => Ok(vec![
                TensorDesc::new(i[0].dtype, i[2].shape.clone()),
                TensorDesc::new(i[5].dtype, i[5].shape.clone()),
            ]),
            DeltaNetOp::DeltaNetDecode { .. } => Err(c.err(
                "updates its outputs in place: the caller supplies them, so they cannot be inferred",
            )),
        }
    }

    fn check_in_place(&self, c: &Ctx) -> Result<()> {
        let (i, o) = (c.inputs, c.outputs);
        if !self.reads_outputs() {
            return Err(c.err("is not an in-place op"));
        }
        c.ensure(o.len() == 2, || {
            format!(
                "produces o and updates state_pool: 2 outputs, got {}",
                o.len()
            )
        })?;
        let v = &i[2].shape.0;
        c.ensure(o[0].shape == i[2].shape && o[0].dtype.is_float(), || {
            format!("o must be a float [{}, {}, {}]", v[0], v[1], v[2])
        })?;
        c.float(&o[1], "state_pool")?;
        c.rank(&o[1], 4, "state_pool")?;
        c.ensure(o[1].shape.0[1..] == [v[1], i[0].shape.0[2], v[2]], || {
            format!(
                "state_pool must be [P, {}, {}, {}]",
                v[1], i[0].shape.0[2], v[2]
            )
        })
    }
}
