//! The softmax family.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, TensorDesc};

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum SoftmaxOp {
    /// Row softmax of `x [.., N] * scale`, soft-capped, plus an optional additive `mask [R', N]`
    /// (f32; row `r` of `x` uses mask row `r % R'`).
    Softmax { scale: f32, soft_cap: Option<f32> },
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for SoftmaxOp {
    fn default() -> Self {
        SoftmaxOp::Softmax {
            scale: 1.0,
            soft_cap: None,
        }
    }
}

impl Family for SoftmaxOp {
    fn name(&self) -> &'static str {
        match self {
            SoftmaxOp::Softmax { .. } => "softmax",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        let SoftmaxOp::Softmax { soft_cap, .. } = self;
        c.n_inputs(&[1, 2])?;
        c.float(&i[0], "x")?;
        c.min_rank(&i[0], 1, "x")?;
        if let Some(cap) = soft_cap {
            c.ensure(*cap > 0.0, || "soft cap must be positive".into())?;
        }
        if i.len() == 2 {
            c.dtype(&i[1], DType::F32, "mask")?;
            let rows = i[0].shape.rows();
            let mrows = i[1].shape.rows();
            c.ensure(
                i[1].shape.last() == i[0].shape.last() && mrows > 0 && rows % mrows == 0,
                || "mask must be [R', N] with R' dividing x's rows".into(),
            )?;
        }
        Ok(())
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        Ok(vec![TensorDesc::new(
            c.inputs[0].dtype,
            c.inputs[0].shape.clone(),
        )])
    }
}
