//! A forward pass whose image rows take a vision encoder's embeddings, for callers that run
//! a model directly (the engine builds these rows itself, `engine/images.rs`).

use super::{Logits, Runner, Session};
use crate::error::Result;
use crate::kv::SeqId;
use crate::model::RowEmbeds;

impl Session<'_> {
    /// [`Session::step`] with some rows' input embeddings given instead of looked up (an
    /// image's soft tokens, [`RowEmbeds`]; rows count the items' tokens one after another,
    /// as the batch holds them).
    pub fn step_with_embeds(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        embeds: Vec<RowEmbeds>,
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        // Each image's grid, for the sequence whose rows it fills (rows count the items'
        // tokens one after another).
        let mut first = 0;
        for (seq, toks, _) in items {
            for e in embeds
                .iter()
                .filter(|e| (first..first + toks.len()).contains(&e.row))
            {
                if let Some(g) = e.grid {
                    self.kv.add_image_grid(*seq, g);
                }
            }
            first += toks.len();
        }
        let mut batch = self.prepare(items)?;
        batch.embeds = embeds;
        let out = self.fwd.run(&batch, None)?;
        self.commit(items)?;
        Ok(out.0)
    }
}

impl Runner {
    /// See [`Session::step_with_embeds`].
    pub fn step_with_embeds(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        embeds: Vec<RowEmbeds>,
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        self.session().step_with_embeds(items, embeds)
    }
}
