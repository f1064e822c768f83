//! The causal depthwise conv1d family (the short convolutions of hybrid models), with the
//! state each sequence carries.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, TensorDesc};

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum ConvOp {
    /// Causal depthwise conv1d with carried state over a batch of sequences. `x [T, C]`,
    /// `w [C, K]`, `state [S, K-1, C]` (the last K-1 inputs before each sequence),
    /// `seq_start [S + 1]` → `y [T, C]`, `state_out [S, K-1, C]`. SiLU on the output when `silu`.
    Conv1d { silu: bool },
    /// One conv1d decode step per sequence with the state pool updated in place:
    /// `x [S, C]`, `w [C, K]`, `slots [S]` → `y [S, C]`, output 1 `state_pool [P, K-1, C]`.
    Conv1dDecode { silu: bool },
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for ConvOp {
    fn default() -> Self {
        ConvOp::Conv1d { silu: false }
    }
}

impl Family for ConvOp {
    fn name(&self) -> &'static str {
        match self {
            ConvOp::Conv1d { .. } => "conv1d",
            ConvOp::Conv1dDecode { .. } => "conv1d_decode",
        }
    }

    fn reads_outputs(&self) -> bool {
        matches!(self, ConvOp::Conv1dDecode { .. })
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        match self {
            ConvOp::Conv1d { .. } => {
                c.n_inputs(&[4])?;
                c.float(&i[0], "x")?;
                c.float(&i[1], "w")?;
                c.float(&i[2], "state")?;
                c.rank(&i[0], 2, "x")?;
                c.rank(&i[1], 2, "w")?;
                c.rank(&i[2], 3, "state")?;
                c.dtype(&i[3], DType::I32, "seq_start")?;
                let ch = i[0].shape.0[1];
                let kw = i[1].shape.0[1];
                c.ensure(i[1].shape.0[0] == ch && kw >= 1, || {
                    format!("w must be [{ch}, K]")
                })?;
                let s = i[2].shape.0[0];
                c.ensure(i[2].shape.0[1..] == [kw - 1, ch], || {
                    format!("state must be [S, {}, {ch}]", kw - 1)
                })?;
                c.ensure(i[3].shape.0 == [s + 1], || {
                    format!("seq_start must be [{}]", s + 1)
                })
            }
            ConvOp::Conv1dDecode { .. } => {
                c.n_inputs(&[3])?;
                c.float(&i[0], "x")?;
                c.float(&i[1], "w")?;
                c.rank(&i[0], 2, "x")?;
                c.rank(&i[1], 2, "w")?;
                c.dtype(&i[2], DType::I32, "slots")?;
                c.ensure(
                    i[1].shape.0[0] == i[0].shape.0[1] && i[1].shape.0[1] >= 1,
                    || "w must be [C, K]".into(),
                )?;
                c.ensure(i[2].shape.0 == [i[0].shape.0[0]], || {
                    "slots must be [S]".into()
                })
            }
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        match self {
            ConvOp::Conv1d { .. } => Ok(vec![
                TensorDesc::new(i[0].dtype, i[0].shape.clone()),
                TensorDesc::new(i[2].dtype, i[2].shape.clone()),
            ]),
            ConvOp::Conv1dDecode { .. } => Err(c.err(
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
                "produces y and updates state_pool: 2 outputs, got {}",
                o.len()
            )
        })?;
        c.ensure(o[0].shape == i[0].shape && o[0].dtype.is_float(), || {
            "y must be a float tensor of x's shape".into()
        })?;
        c.float(&o[1], "state_pool")?;
        c.rank(&o[1], 3, "state_pool")?;
        let (ch, kw) = (i[0].shape.0[1], i[1].shape.0[1]);
        c.ensure(o[1].shape.0[1..] == [kw - 1, ch], || {
            format!("state_pool must be [P, {}, {ch}]", kw - 1)
        })
    }
}
