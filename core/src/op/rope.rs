//! The rotary position embedding family.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, TensorDesc};

/// How rotary pairs are formed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml's "normal", GGUF Llama weights).
    #[default]
    Normal,
    /// Halves `(x[i], x[i + n_rot/2])` (GPT-NeoX, Hugging Face `rotate_half`).
    Neox,
}

/// Rotary position embedding of `x [T, H, D]` at positions `pos [T]`.
///
/// Only the first `n_rot` dims of each head rotate (partial rotary); the rest pass through.
/// Pair `i` turns by `pos · freq_scale · base^(-2i/n_rot) / f[i]`, where `f` is the optional
/// third input `freq_factors [n_rot/2]` (Llama-3 style scaling; an infinite factor leaves a
/// pair unrotated), and cos/sin are multiplied by `attn_factor` (YaRN's magnitude scale).
#[derive(Copy, Clone, Debug, PartialEq, Default)]
pub struct RopeParams {
    pub mode: RopeMode,
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    pub attn_factor: f32,
}

impl RopeParams {
    /// The checks every op taking these parameters makes: `n_rot` fits a head of `head_dim`,
    /// the frequencies are positive, and `factors` (where given) is `[n_rot/2]` f32.
    pub(crate) fn check(
        &self,
        c: &Ctx,
        head_dim: usize,
        factors: Option<&TensorDesc>,
    ) -> Result<()> {
        c.ensure(
            self.n_rot % 2 == 0 && self.n_rot > 0 && self.n_rot <= head_dim,
            || {
                format!(
                    "n_rot {} must be even, positive and at most the head dim {head_dim}",
                    self.n_rot
                )
            },
        )?;
        c.ensure(self.base > 0.0 && self.freq_scale > 0.0, || {
            "base and freq_scale must be positive".into()
        })?;
        if let Some(f) = factors {
            c.dtype(f, DType::F32, "freq_factors")?;
            c.ensure(f.shape.0 == [self.n_rot / 2], || {
                format!("freq_factors must be [{}]", self.n_rot / 2)
            })?;
        }
        Ok(())
    }

    pub fn new(mode: RopeMode, n_rot: usize, base: f32) -> Self {
        RopeParams {
            mode,
            n_rot,
            base,
            freq_scale: 1.0,
            attn_factor: 1.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum RopeOp {
    /// `x [T, H, D]`, `pos [T]`, optional `freq_factors [n_rot/2]` (f32) → `[T, H, D]`.
    Rope(RopeParams),
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for RopeOp {
    fn default() -> Self {
        RopeOp::Rope(RopeParams::default())
    }
}

impl Family for RopeOp {
    fn name(&self) -> &'static str {
        match self {
            RopeOp::Rope(_) => "rope",
        }
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        let RopeOp::Rope(p) = self;
        c.n_inputs(&[2, 3])?;
        c.float(&i[0], "x")?;
        c.rank(&i[0], 3, "x")?;
        c.dtype(&i[1], DType::I32, "positions")?;
        let d = c.dims(&i[0]);
        c.ensure(i[1].shape.0 == [d[0]], || {
            format!("positions must be [{}]", d[0])
        })?;
        p.check(c, d[2], i.get(2))
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        Ok(vec![TensorDesc::new(
            c.inputs[0].dtype,
            c.inputs[0].shape.clone(),
        )])
    }
}
