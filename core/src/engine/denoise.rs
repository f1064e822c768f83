//! The engine's side of block diffusion: a diffusion model's requests are [`Tasks`], served
//! in turn one forward pass each; their canvases' tokens go out when committed.

use super::batching::Engine;
use super::diffusion::{CanvasTask, DiffusionRequest};
use super::request::{Event, Finish, GenRequest};
use crate::error::{Error, Result};
use crate::sample::diffusion::DiffusionParams;
use crate::sched::ReqId;

impl Engine {
    /// The denoising settings requests to a diffusion model get (their seed is the request's,
    /// when it has one).
    pub fn set_diffusion_defaults(&mut self, p: DiffusionParams) -> Result<()> {
        p.validate()?;
        if let Some(d) = &mut self.diffusion {
            d.defaults = p;
        }
        Ok(())
    }

    /// Takes a checked request as a diffusion task.
    pub(super) fn admit_diffusion(&mut self, id: ReqId, req: GenRequest) -> Result<()> {
        let Some(d) = &self.diffusion else {
            return Err(Error::Model("not a diffusion model".into()));
        };
        let mut params = d.defaults.clone();
        params.seed = req
            .params
            .seed
            .unwrap_or(params.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let r = DiffusionRequest {
            prompt: req.prompt,
            max_tokens: req.max_tokens,
            params,
            init_canvas: req.init_canvas,
            stop_ids: req.stop_ids,
            drafts: req.drafts,
            timed: false,
        };
        let task = match CanvasTask::new(&self.fwd, r) {
            Ok(t) => t,
            Err(e) => return self.fail(id, e.to_string()),
        };
        if let Some(d) = &mut self.diffusion {
            d.push(id, task);
        }
        Ok(())
    }

    /// Forgets `id`'s task (if any) and frees its cache (also when its step failed or
    /// panicked with the task out of the map).
    pub(super) fn drop_diffusion(&mut self, id: ReqId) -> Result<()> {
        let Some(d) = &mut self.diffusion else {
            return Ok(());
        };
        d.remove(id);
        let kv = self.sched.kv_mut();
        if kv.contains(id) {
            kv.free(id)?;
        }
        Ok(())
    }

    /// One forward pass of the next diffusion request in turn: its tokens go out when a
    /// canvas is committed. Returns false when there is nothing to do.
    pub(super) fn diffusion_step(&mut self) -> Result<bool> {
        let Some(d) = &mut self.diffusion else {
            return Ok(false);
        };
        let Some((id, mut task)) = d.take_next() else {
            return Ok(false);
        };
        self.stats.steps += 1;
        let fresh = task.fresh();
        let s = match task.step(&mut self.session(), id) {
            Ok(s) => s,
            Err(e) => {
                if let Some(d) = &mut self.diffusion {
                    d.put_back(id, None);
                }
                self.fail(id, format!("forward pass failed: {e}"))?;
                return Ok(true);
            }
        };
        let stopped = task.sum.stopped;
        if fresh {
            self.stats.prefix_queried_tokens += task.prompt_len() as u64;
            self.stats.prefix_hit_tokens += s.cached as u64;
            if let (true, Some(a)) = (s.cached > 0, self.active.get_mut(&id)) {
                a.tx.send(Event::Cached(s.cached));
            }
        }
        if let Some(d) = &mut self.diffusion {
            d.put_back(id, Some((task, s.finished)));
        }
        if s.denoised {
            self.stats.denoising_steps += 1;
        }
        if let Some(tokens) = s.draft {
            let draft = Event::Draft {
                canvas: s.canvas,
                step: s.step,
                tokens,
            };
            if !self.send(id, draft)? {
                return Ok(true);
            }
        }
        if let Some((tokens, steps)) = s.committed {
            self.stats.canvases += 1;
            // The canvas is announced before its tokens: a stop string inside them ends the
            // client's choice, and the canvas must be counted by then.
            if !self.send(id, Event::Canvas { steps })? {
                return Ok(true);
            }
            self.sched.record_outside(id, &tokens);
            for tok in tokens {
                self.stats.generated += 1;
                if !self.active.contains_key(&id) {
                    break;
                }
                if !self.send(id, Event::Token(tok, None))? {
                    return Ok(true);
                }
            }
        }
        if s.finished {
            let finish = if stopped {
                Finish::Stop
            } else {
                Finish::Length
            };
            self.end(id, Some(finish))?;
        }
        Ok(true)
    }
}
