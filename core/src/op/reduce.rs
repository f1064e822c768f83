//! The reduction family: argmax and top-k over each row of the last dimension.

use super::check::{lead, with_last};
use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, TensorDesc};

#[derive(Clone, Debug, PartialEq, Default, strum::EnumIter)]
pub enum ReduceOp {
    /// `x [.., N]` → `[..]` (i32), the first index of the maximum.
    #[default]
    Argmax,
    /// `x [.., N]` → values `[.., k]` (f32), indices `[.., k]` (i32), largest first, ties to
    /// the lower index.
    TopK(usize),
}

impl Family for ReduceOp {
    fn name(&self) -> &'static str {
        match self {
            ReduceOp::Argmax => "argmax",
            ReduceOp::TopK(_) => "top_k",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        c.n_inputs(&[1])?;
        c.float(&i[0], "x")?;
        c.min_rank(&i[0], 1, "x")?;
        if let ReduceOp::TopK(k) = self {
            c.ensure(*k >= 1 && *k <= i[0].shape.last(), || {
                format!("k = {k} must be in 1..={}", i[0].shape.last())
            })?;
        }
        c.ensure(i[0].shape.last() > 0, || "rows must not be empty".into())
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let x = &c.inputs[0];
        Ok(match self {
            ReduceOp::Argmax => vec![TensorDesc::new(DType::I32, lead(&x.shape))],
            ReduceOp::TopK(k) => {
                let s = with_last(&x.shape, *k);
                vec![
                    TensorDesc::new(DType::F32, s.clone()),
                    TensorDesc::new(DType::I32, s),
                ]
            }
        })
    }
}
