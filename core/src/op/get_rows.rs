//! The embedding family: rows of a table by id, and the soft embedding (a softmax-weighted
//! mix of rows).

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, Shape, TensorDesc};

#[derive(Clone, Debug, PartialEq, Default, strum::EnumIter)]
pub enum GetRowsOp {
    /// Embedding lookup: `table [V, D]` (any dtype), `ids [N]` → `[N, D]` (float).
    #[default]
    GetRows,
    /// A soft embedding: `logits [T, V]` (f32), `table [V, E]` (any dtype) → `[T, E]`,
    /// `Σⱼ softmax(logits[t])ⱼ · table[j]` over every row (`top_k` 0 or ≥ V), or over the
    /// `top_k` largest logits with the softmax taken over those (DiffusionGemma's
    /// self-conditioning).
    SoftEmbedding { top_k: usize },
}

impl Family for GetRowsOp {
    fn name(&self) -> &'static str {
        match self {
            GetRowsOp::GetRows => "get_rows",
            GetRowsOp::SoftEmbedding { .. } => "soft_embedding",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        match self {
            GetRowsOp::GetRows => {
                c.n_inputs(&[2])?;
                c.rank(&i[0], 2, "table")?;
                c.blocks(&i[0], "table")?;
                c.ensure(!i[0].dtype.is_int(), || {
                    "table must be a float or block type".into()
                })?;
                c.dtype(&i[1], DType::I32, "ids")?;
                c.rank(&i[1], 1, "ids")
            }
            GetRowsOp::SoftEmbedding { .. } => {
                c.n_inputs(&[2])?;
                c.dtype(&i[0], DType::F32, "logits")?;
                c.rank(&i[0], 2, "logits")?;
                c.rank(&i[1], 2, "table")?;
                c.ensure(i[1].shape.0[0] == i[0].shape.0[1], || {
                    format!("table must have {} rows", i[0].shape.0[1])
                })
            }
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        // (rows, table)
        let (rows, table) = match self {
            GetRowsOp::GetRows => (i[1].shape.0[0], &i[0]),
            GetRowsOp::SoftEmbedding { .. } => (i[0].shape.0[0], &i[1]),
        };
        Ok(vec![TensorDesc::new(
            DType::F32,
            Shape(vec![rows, table.shape.0[1]]),
        )])
    }
}
