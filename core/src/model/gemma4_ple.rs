//! Gemma 4's per-layer embedding inputs: for each layer, a slice of a token table (its
//! `width` columns of the layer) and a projection of the embedded batch, RMS-normed; the two
//! added and scaled by `1/√2`.

use super::weights::Weights;
use crate::error::Result;
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::tensor::Tensor;

/// The per-layer embedding inputs: a token table and a projection of the embeddings per layer.
pub(super) struct PleInputs {
    width: usize,
    tables: Vec<Tensor>,
    projs: Vec<Tensor>,
    norm: Tensor,
}

impl PleInputs {
    /// The tables and projections of `layers` layers of `width` each, over embeddings of `e`.
    pub(super) fn load(
        f: &GgufFile,
        w: &mut Weights,
        layers: usize,
        width: usize,
        e: usize,
    ) -> Result<PleInputs> {
        let p = width;
        let vp = f
            .tensor("per_layer_token_embd.weight")?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        let (mut tables, mut projs) = (Vec::new(), Vec::new());
        for l in 0..layers {
            tables.push(w.get_cols(
                "per_layer_token_embd.weight",
                &[vp, layers * p],
                l * p..(l + 1) * p,
            )?);
            let rows = l * p..(l + 1) * p;
            projs.push(w.get_rows(
                "per_layer_model_proj.weight",
                &[layers * p, e],
                std::slice::from_ref(&rows),
            )?);
        }
        Ok(PleInputs {
            width: p,
            tables,
            projs,
            norm: w.get("per_layer_proj_norm.weight", &[p])?,
        })
    }

    /// Every layer's input, `[T, width]` each, for the embedded batch `x0` (`e` wide) of token
    /// ids `ids`; `eps`: the norm's.
    pub(super) fn inputs(
        &self,
        ex: &Executor,
        x0: &Tensor,
        ids: &Tensor,
        e: usize,
        eps: f32,
    ) -> Result<Vec<Tensor>> {
        let e = e as f32;
        let mut out = Vec::with_capacity(self.tables.len());
        for (table, proj) in self.tables.iter().zip(&self.projs) {
            let ctx = ex.scale(&ex.matmul(x0, proj)?, 1.0 / e.sqrt())?;
            let ctx = ex.rms_norm(&ctx, &self.norm, eps, false)?;
            let tok = ex.scale(&ex.get_rows(table, ids)?, (self.width as f32).sqrt())?;
            out.push(ex.scale(&ex.add(&ctx, &tok)?, std::f32::consts::FRAC_1_SQRT_2)?);
        }
        Ok(out)
    }
}
