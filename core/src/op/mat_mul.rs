//! The matmul family: `y = x · Wᵀ` by a weight of any dtype, and the fusions around it that
//! save a pass over the activations (the norm before, the GLU before, the residual after).

use super::check::with_last;
use super::elementwise::GluOp;
use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::TensorDesc;

/// The most weights one [`MatMulOp::RmsNormMatMul`] takes (Q, K and V).
pub const MAX_SHARED_NORM: usize = 3;

#[derive(Clone, Debug, PartialEq, Default, strum::EnumIter)]
pub enum MatMulOp {
    /// `x [.., K]` (float), `w [N, K]` (any dtype) → `y [.., N]`.
    #[default]
    MatMul,
    /// `MatMul` then `Add` of the residual stream (the attention output projection):
    /// `x [.., K]`, `w [N, K]`, `r [.., N]` → `x · wᵀ + r`.
    MatMulAdd,
    /// `RmsNorm` then `MatMul` by each of one to three weights that share the norm (Q, K and V;
    /// gate and up): `x [.., K]`, `norm_w [K]`, `w_j [N_j, K]` → `y_j [.., N_j]`, an output
    /// per weight.
    RmsNormMatMul { eps: f32, one_plus: bool },
    /// `Glu` then `MatMul` (the down projection): `gate [.., F]`, `up [.., F]`, `w [N, F]` →
    /// `[.., N]`; with a fourth input, the residual `r [.., N]`, added to the result
    /// (`MatMulAdd`'s epilogue).
    GluMatMul(GluOp),
}

impl Family for MatMulOp {
    fn name(&self) -> &'static str {
        match self {
            MatMulOp::MatMul => "mat_mul",
            MatMulOp::MatMulAdd => "mat_mul_add",
            MatMulOp::RmsNormMatMul { .. } => "rms_norm_mat_mul",
            MatMulOp::GluMatMul(_) => "glu_mat_mul",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        let (x, w) = match self {
            MatMulOp::MatMul => {
                c.n_inputs(&[2])?;
                (&i[0], &i[1])
            }
            MatMulOp::MatMulAdd => {
                c.n_inputs(&[3])?;
                (&i[0], &i[1])
            }
            MatMulOp::RmsNormMatMul { eps, .. } => {
                c.ensure(i.len() >= 3 && i.len() <= 2 + MAX_SHARED_NORM, || {
                    format!(
                        "takes x, the norm weight and 1 to {} weights, got {} inputs",
                        MAX_SHARED_NORM,
                        i.len()
                    )
                })?;
                for (j, w) in i.iter().enumerate().skip(3) {
                    c.rank(w, 2, "weight")?;
                    c.ensure(!w.dtype.is_int(), || {
                        format!("weight {j} dtype {} is not a weight type", w.dtype)
                    })?;
                    c.blocks(w, "weight")?;
                    c.ensure(w.shape.0[1] == i[0].shape.last(), || {
                        format!(
                            "weight {j} width {} != activation width {}",
                            w.shape.0[1],
                            i[0].shape.last()
                        )
                    })?;
                }
                c.float(&i[1], "norm weight")?;
                c.ensure(i[1].shape.0 == [i[0].shape.last()], || {
                    format!("norm weight must be [{}]", i[0].shape.last())
                })?;
                c.ensure(*eps >= 0.0, || "eps must be non-negative".into())?;
                (&i[0], &i[2])
            }
            MatMulOp::GluMatMul(_) => {
                c.n_inputs(&[3, 4])?;
                c.float(&i[1], "up")?;
                c.ensure(i[0].shape == i[1].shape, || {
                    "gate and up must have one shape".into()
                })?;
                (&i[0], &i[2])
            }
        };
        c.float(x, "activation")?;
        c.min_rank(x, 1, "activation")?;
        c.rank(w, 2, "weight")?;
        c.ensure(!w.dtype.is_int(), || {
            format!("weight dtype {} is not a weight type", w.dtype)
        })?;
        c.blocks(w, "weight")?;
        c.ensure(x.shape.last() == w.shape.0[1], || {
            format!(
                "activation width {} != weight width {}",
                x.shape.last(),
                w.shape.0[1]
            )
        })?;
        // The residual of MatMulAdd (input 2) and of GluMatMul (input 3): the output's
        // shape, in the activation's dtype.
        let res = match self {
            MatMulOp::MatMulAdd => i.get(2),
            MatMulOp::GluMatMul(_) => i.get(3),
            _ => None,
        };
        match res {
            Some(r) => {
                c.dtype(r, x.dtype, "residual")?;
                c.ensure(r.shape == with_last(&x.shape, w.shape.0[0]), || {
                    format!(
                        "residual must have the output's shape {}",
                        with_last(&x.shape, w.shape.0[0])
                    )
                })
            }
            None => Ok(()),
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        let act = i[0].dtype;
        let out = |w: &TensorDesc| TensorDesc::new(act, with_last(&i[0].shape, w.shape.0[0]));
        Ok(match self {
            MatMulOp::RmsNormMatMul { .. } => i[2..].iter().map(out).collect(),
            MatMulOp::MatMul | MatMulOp::MatMulAdd => vec![out(&i[1])],
            MatMulOp::GluMatMul(_) => vec![out(&i[2])],
        })
    }
}
