//! The normalisation family: each row of the last dimension scaled by a statistic of itself.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::TensorDesc;

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum NormOp {
    /// `x [.., D]`, `w [D]` → `x / rms(x) * w`, or `* (1 + w)` when `one_plus` (Gemma).
    RmsNorm { eps: f32, one_plus: bool },
    /// `x [.., D]` → `x / sqrt(Σx² + eps)` per row (Qwen3.5's `l2norm`).
    L2Norm { eps: f32 },
    /// `x [.., D]`, `w [D]`, `b [D]` → `(x − mean(x)) / sqrt(var(x) + eps) * w + b` per row,
    /// with the population variance (torch's `LayerNorm`: the vision towers' norm).
    LayerNorm { eps: f32 },
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for NormOp {
    fn default() -> Self {
        NormOp::RmsNorm {
            eps: 0.0,
            one_plus: false,
        }
    }
}

impl Family for NormOp {
    fn name(&self) -> &'static str {
        match self {
            NormOp::RmsNorm { .. } => "rms_norm",
            NormOp::L2Norm { .. } => "l2_norm",
            NormOp::LayerNorm { .. } => "layer_norm",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        match self {
            NormOp::RmsNorm { eps, .. } => {
                c.n_inputs(&[2])?;
                c.float(&i[0], "x")?;
                c.float(&i[1], "weight")?;
                c.ensure(i[1].shape.0 == [i[0].shape.last()], || {
                    format!("weight must be [{}]", i[0].shape.last())
                })?;
                c.ensure(*eps >= 0.0, || "eps must be non-negative".into())
            }
            NormOp::L2Norm { eps } => {
                c.n_inputs(&[1])?;
                c.float(&i[0], "x")?;
                c.ensure(*eps >= 0.0, || "eps must be non-negative".into())
            }
            NormOp::LayerNorm { eps } => {
                c.n_inputs(&[3])?;
                c.float(&i[0], "x")?;
                for (t, what) in [(&i[1], "weight"), (&i[2], "bias")] {
                    c.float(t, what)?;
                    c.ensure(t.shape.0 == [i[0].shape.last()], || {
                        format!("{what} must be [{}]", i[0].shape.last())
                    })?;
                }
                c.ensure(*eps > 0.0, || "eps must be positive".into())
            }
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        Ok(vec![TensorDesc::new(
            c.inputs[0].dtype,
            c.inputs[0].shape.clone(),
        )])
    }
}
