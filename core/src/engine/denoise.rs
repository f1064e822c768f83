//! The engine's side of block diffusion: a diffusion request's [`Canvas`] beside its record
//! in the scheduler (which plans its prompt chunks, its denoising items and its committed
//! canvases like any other request's tokens), and what a pass's canvas items do after it.

use super::batching::Engine;
use super::diffusion::{Canvas, DiffusionRequest};
use super::request::{Event, GenRequest};
use crate::error::{Error, Result};
use crate::model::CanvasInput;
use crate::sample::diffusion::DiffusionParams;
use crate::sched::{Item, ReqId};
use crate::tensor::Tensor;

impl Engine {
    /// The denoising settings requests to a diffusion model get (their seed is the request's,
    /// when it has one).
    pub fn set_diffusion_defaults(&mut self, p: DiffusionParams) -> Result<()> {
        p.validate()?;
        if let Some(d) = &mut self.diffusion {
            *d = p;
        }
        Ok(())
    }

    /// A diffusion request's denoising state (checked against the model and the limits).
    pub(super) fn canvas_for(&self, id: ReqId, req: &GenRequest) -> Result<Canvas> {
        let Some(defaults) = &self.diffusion else {
            return Err(Error::Model("not a diffusion model".into()));
        };
        let mut params = defaults.clone();
        params.seed = req
            .params
            .seed
            .unwrap_or(params.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let r = DiffusionRequest {
            prompt: req.prompt.clone(),
            max_tokens: req.max_tokens,
            params,
            init_canvas: req.init_canvas.clone(),
            stop_ids: req.stop_ids.clone(),
            drafts: req.drafts,
            timed: false,
        };
        Canvas::new(&self.fwd, &r)
    }

    /// Before a pass: each canvas item's canvas on the device (put there at its first step).
    pub(super) fn prepare_canvases(&mut self, items: &[Item]) -> Result<()> {
        for it in items {
            let c = (self.active.get_mut(&it.id))
                .and_then(|a| a.canvas.as_mut())
                .ok_or_else(|| Error::Model(format!("request {} has no canvas", it.id)))?;
            c.prepare(self.fwd.executor())?;
        }
        Ok(())
    }

    /// The canvas items' inputs to the pass, in the items' order.
    pub(super) fn canvas_inputs(&self, items: &[Item]) -> Result<Vec<CanvasInput<'_>>> {
        items
            .iter()
            .map(|it| {
                (self.active.get(&it.id))
                    .and_then(|a| a.canvas.as_ref())
                    .ok_or_else(|| Error::Model(format!("request {} has no canvas", it.id)))?
                    .input()
            })
            .collect()
    }

    /// After a pass: `id`'s canvas drawn and accepted over its `logits`; its draft goes out
    /// when the request wants drafts. Returns the canvas's tokens when it is done, and the
    /// steps it took (`None` when the request is gone: cancelled meanwhile).
    pub(super) fn denoised(
        &mut self,
        id: ReqId,
        logits: &Tensor,
    ) -> Result<Option<(Vec<u32>, usize)>> {
        self.stats.denoising_steps += 1;
        let Some(c) = self.active.get_mut(&id).and_then(|a| a.canvas.as_mut()) else {
            return Ok(None);
        };
        let d = c.after(self.fwd.executor(), logits)?;
        if let Some(tokens) = d.draft {
            let draft = Event::Draft {
                canvas: d.canvas,
                step: d.step,
                tokens,
            };
            if !self.send(id, draft)? {
                return Ok(None);
            }
        }
        Ok(Some((d.committed.unwrap_or_default(), d.step)))
    }
}
