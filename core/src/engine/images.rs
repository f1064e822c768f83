//! Images in a generation request: where their soft tokens sit in the prompt (checked when
//! the request comes in), encoded by the model's vision tower the first time a prefill chunk
//! needs them (a prompt whose image blocks all come from the prefix cache never encodes its
//! image), and each chunk's image rows handed to the forward pass.

use std::sync::Arc;

use super::batching::Engine;
use super::vision::{PromptImage, Vision};
use crate::error::{Error, Result};
use crate::kv::ContentSpan;
use crate::model::{ImageGrid, RowEmbeds, VisionTower};
use crate::sched::Plan;

impl Engine {
    /// Gives the engine a vision tower built on its executor's backend, and the id its soft
    /// token has in the model's vocabulary (what the prompt holds at each image's rows).
    pub fn set_vision(&mut self, tower: Arc<VisionTower>, soft_token: u32) {
        self.vision = Some(Vision {
            tower,
            token: soft_token,
        });
    }

    /// Checks a request's images against its prompt: a tower to encode them, each image's
    /// soft tokens in place, in order, none overlapping and none without an image. Returns
    /// their spans.
    pub(super) fn image_spans(
        &self,
        prompt: &[u32],
        images: &[PromptImage],
    ) -> Result<Vec<ContentSpan>> {
        let Some(v) = &self.vision else {
            if images.is_empty() {
                return Ok(Vec::new());
            }
            return Err(Error::Model(
                "this model takes no images (no vision tower is loaded; a GGUF's is its mmproj file)"
                    .into(),
            ));
        };
        let mut spans = Vec::with_capacity(images.len());
        let mut end = 0;
        let mut total = 0usize;
        for (i, im) in images.iter().enumerate() {
            let n = v.tower.tokens_for(&im.image.rgb)?;
            total = total.saturating_add(n);
            let span = im.start..im.start.saturating_add(n);
            if im.start < end || span.end > prompt.len() {
                return Err(Error::Model(format!(
                    "image {i}: its {n} soft tokens at {} overlap another image or run past the prompt",
                    im.start
                )));
            }
            if prompt[span.clone()].iter().any(|&t| t != v.token) {
                return Err(Error::Model(format!(
                    "image {i}: the prompt does not hold its {n} soft tokens at {}",
                    im.start
                )));
            }
            end = span.end;
            spans.push(ContentSpan {
                start: im.start,
                len: n,
                digest: im.image.digest,
            });
        }
        let soft = prompt.iter().filter(|&&t| t == v.token).count();
        if soft != total {
            return Err(Error::Model(format!(
                "the prompt holds {soft} image soft tokens for {} images of {total} in all",
                images.len()
            )));
        }
        Ok(spans)
    }

    /// The image rows of a plan's batch: for each item, the soft tokens of the images its
    /// tokens cover (each image encoded on first need and kept until its request ends); and,
    /// for a model that places image tokens by row and column, every sequence's image grids.
    pub(super) fn image_rows(&mut self, plan: &mut Plan) -> Result<()> {
        let mut rows = Vec::new();
        let Some(v) = &self.vision else {
            return Ok(());
        };
        let ex = self.fwd.executor();
        for (it, seq) in plan.items.iter().zip(plan.batch.seqs.iter_mut()) {
            let Some(a) = self.active.get_mut(&it.id) else {
                continue;
            };
            for slot in a.images.iter_mut() {
                let (s, e) = (slot.span.start, slot.span.start + slot.span.len);
                let grid = match v.tower.grid(&slot.image.rgb)? {
                    Some((r, c)) if r * c == slot.span.len => Some(ImageGrid {
                        start: s,
                        rows: r,
                        cols: c,
                    }),
                    Some((r, c)) => {
                        return Err(Error::Model(format!(
                            "an image's {r}x{c} grid does not fill its {} soft tokens",
                            slot.span.len
                        )))
                    }
                    None => None,
                };
                if let Some(g) = grid.filter(|_| s < it.end) {
                    seq.images.push(g);
                }
                let (lo, hi) = (s.max(it.start), e.min(it.end));
                if lo >= hi {
                    continue;
                }
                if slot.embeds.is_none() {
                    let t = crate::time::Instant::now();
                    let e = v.tower.encode(ex, &slot.image.rgb)?;
                    ex.backend().synchronize()?;
                    self.stats.images_encoded += 1;
                    self.stats.image_encode_us += t.elapsed().as_micros() as u64;
                    slot.embeds = Some(e);
                }
                let Some(all) = &slot.embeds else { continue };
                rows.push(RowEmbeds {
                    row: seq.q_start + lo - it.start,
                    embeds: ex.rows(all, lo - s..hi - s)?,
                    span_end: e,
                    grid,
                });
            }
        }
        rows.sort_by_key(|r| r.row);
        plan.batch.embeds = rows;
        Ok(())
    }
}
