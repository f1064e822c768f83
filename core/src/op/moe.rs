//! The mixture-of-experts family: routing, matmuls by expert id and mixing the experts'
//! outputs.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, Shape, TensorDesc};

/// Gating of MoE router logits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum MoeGating {
    #[default]
    Softmax,
    Sigmoid,
}

#[derive(Clone, Debug, PartialEq, Default, strum::EnumIter)]
pub enum MoeOp {
    /// Matmul by expert id. `x [T, K]` or `[T, k, K]`, `w [E, N, K]` (any dtype),
    /// `ids [T, k]` → `y [T, k, N]`, where `y[t, i] = x[t, i or 0] · w[ids[t, i]]ᵀ`.
    #[default]
    MatMulId,
    /// Router: `logits [T, E]` → weights `[T, k]` (f32), ids `[T, k]` (i32), best first. Top-k of
    /// the softmax or sigmoid of the logits, renormalised to sum 1 when `normalize`.
    MoeRoute {
        k: usize,
        gating: MoeGating,
        normalize: bool,
    },
    /// Mixing expert outputs: `y [T, k, N]`, `w [T, k]` (f32) → `[T, N]`, `Σᵢ w[t, i]·y[t, i]`.
    MoeSum,
}

impl Family for MoeOp {
    fn name(&self) -> &'static str {
        match self {
            MoeOp::MatMulId => "mat_mul_id",
            MoeOp::MoeRoute { .. } => "moe_route",
            MoeOp::MoeSum => "moe_sum",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        match self {
            MoeOp::MatMulId => {
                c.n_inputs(&[3])?;
                let (x, w, ids) = (&i[0], &i[1], &i[2]);
                c.float(x, "activation")?;
                c.rank(w, 3, "expert weights")?;
                c.ensure(!w.dtype.is_int(), || {
                    format!("weight dtype {} is not a weight type", w.dtype)
                })?;
                c.blocks(w, "expert weights")?;
                c.dtype(ids, DType::I32, "ids")?;
                c.rank(ids, 2, "ids")?;
                let (t, k) = (ids.shape.0[0], ids.shape.0[1]);
                let kdim = w.shape.0[2];
                let ok = x.shape.0 == [t, kdim]
                    || x.shape.0 == [t, k, kdim]
                    || x.shape.0 == [t, 1, kdim];
                c.ensure(ok, || {
                    format!("activation must be [{t}, {kdim}] or [{t}, {k}, {kdim}]")
                })
            }
            MoeOp::MoeRoute { k, .. } => {
                c.n_inputs(&[1])?;
                c.float(&i[0], "logits")?;
                c.rank(&i[0], 2, "logits")?;
                c.ensure(*k >= 1 && *k <= i[0].shape.0[1], || {
                    format!("k = {k} must be in 1..={}", i[0].shape.0[1])
                })
            }
            MoeOp::MoeSum => {
                c.n_inputs(&[2])?;
                c.float(&i[0], "y")?;
                c.rank(&i[0], 3, "y")?;
                c.dtype(&i[1], DType::F32, "w")?;
                c.ensure(i[1].shape.0 == i[0].shape.0[..2], || {
                    format!("w must be [{}, {}]", i[0].shape.0[0], i[0].shape.0[1])
                })
            }
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        let act = i[0].dtype;
        Ok(match self {
            MoeOp::MatMulId => {
                let ids = &i[2].shape.0;
                vec![TensorDesc::new(
                    act,
                    Shape(vec![ids[0], ids[1], i[1].shape.0[1]]),
                )]
            }
            MoeOp::MoeRoute { k, .. } => {
                let s = Shape(vec![i[0].shape.0[0], *k]);
                vec![
                    TensorDesc::new(DType::F32, s.clone()),
                    TensorDesc::new(DType::I32, s),
                ]
            }
            MoeOp::MoeSum => vec![TensorDesc::new(
                act,
                Shape(vec![i[0].shape.0[0], i[0].shape.0[2]]),
            )],
        })
    }
}
