//! Block-diffusion generation (DiffusionGemma): the prompt is encoded into the KV cache, then
//! canvas after canvas is denoised ([`Runner::denoise`] and the [`CanvasSampler`]) and
//! committed by an encoder pass over its argmax tokens, until `max_tokens`, an end token
//! inside a canvas, or the context's end.

use std::collections::{HashMap, VecDeque};

use super::batching::{Engine, Event, Finish, GenRequest};
use super::{Logits, Runner};
use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::sample::diffusion::{CanvasSampler, DiffusionParams};
use crate::sched::ReqId;

/// One diffusion generation.
#[derive(Clone, Debug)]
pub struct DiffusionRequest {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (whole canvases are denoised; the last is cut).
    pub max_tokens: usize,
    pub params: DiffusionParams,
    /// The first canvas's starting tokens (else uniform noise).
    pub init_canvas: Option<Vec<u32>>,
    /// Tokens that end the generation (not emitted).
    pub stop_ids: Vec<u32>,
}

/// What the generation reports as it goes.
#[derive(Clone, Debug, PartialEq)]
pub enum DiffusionEvent {
    /// A denoising step's argmax canvas (a draft).
    Draft {
        canvas: usize,
        step: usize,
        tokens: Vec<u32>,
    },
    /// A committed canvas: its tokens (cut at an end token or `max_tokens`) and the steps it
    /// took.
    Canvas { tokens: Vec<u32>, steps: usize },
}

/// Why and after how much a generation ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiffusionSummary {
    pub generated: usize,
    pub canvases: usize,
    pub steps: usize,
    /// An end token was met (else `max_tokens` or the context).
    pub stopped: bool,
    /// Seconds in the decoder's forward passes (logits downloaded), and on the host between
    /// them (the sampler, the self-conditioning logits prepared for the next step).
    pub decoder_seconds: f64,
    pub host_seconds: f64,
}

/// Runs `req` on `seq` (a sequence not yet in the cache); `on` sees each event and returns
/// `Ok(false)` to stop. The sequence is released at the end.
pub fn generate(
    runner: &mut Runner,
    seq: SeqId,
    req: &DiffusionRequest,
    mut on: impl FnMut(DiffusionEvent) -> Result<bool>,
) -> Result<DiffusionSummary> {
    let out = run(runner, seq, req, &mut on);
    let freed = runner.release(seq);
    let out = out?;
    freed?;
    Ok(out)
}

fn run(
    runner: &mut Runner,
    seq: SeqId,
    req: &DiffusionRequest,
    on: &mut impl FnMut(DiffusionEvent) -> Result<bool>,
) -> Result<DiffusionSummary> {
    let mut task = CanvasTask::new(runner, req.clone())?;
    loop {
        let s = task.step(runner, seq)?;
        if let Some(tokens) = s.draft {
            let draft = DiffusionEvent::Draft {
                canvas: task.sum.canvases,
                step: task.steps,
                tokens,
            };
            if !on(draft)? {
                return Ok(task.sum);
            }
        }
        if let Some((tokens, steps)) = s.committed {
            let more = on(DiffusionEvent::Canvas { tokens, steps })?;
            if !more {
                return Ok(task.sum);
            }
        }
        if s.finished {
            return Ok(task.sum);
        }
    }
}

/// What one [`CanvasTask::step`] did.
#[derive(Clone, Debug, Default)]
pub struct TaskStep {
    /// The step's argmax canvas (none for the step that only encoded the prompt).
    pub draft: Option<Vec<u32>>,
    /// A canvas committed this step: its tokens (cut at an end token or `max_tokens`) and the
    /// denoising steps it took.
    pub committed: Option<(Vec<u32>, usize)>,
    /// The generation is over (`sum.stopped` says whether an end token ended it).
    pub finished: bool,
    /// Prompt tokens taken from the prefix cache (on the step that encodes the prompt).
    pub cached: usize,
}

/// One diffusion generation as a state machine advanced one forward pass at a time (the
/// prompt's encoding, a denoising step, or a denoising step that ends a canvas and the
/// encoder pass that commits it), so an engine can interleave it with other work.
pub struct CanvasTask {
    req: DiffusionRequest,
    sampler: CanvasSampler,
    canvas_len: usize,
    prompt_fed: bool,
    canvas: Vec<u32>,
    argmax: Vec<u32>,
    self_cond: Option<Vec<f32>>,
    /// Denoising steps left for the current canvas, and taken so far.
    remaining: usize,
    steps: usize,
    pub sum: DiffusionSummary,
}

impl CanvasTask {
    /// Checks `req` against the runner's model and context.
    pub fn new(runner: &Runner, req: DiffusionRequest) -> Result<CanvasTask> {
        let c = runner
            .model()
            .canvas_length()
            .ok_or_else(|| Error::Model("this model does not generate by diffusion".into()))?;
        let vocab = runner.model().info().vocab;
        if req.prompt.is_empty() {
            return Err(Error::Model("the prompt is empty".into()));
        }
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        if let Some(init) = &req.init_canvas {
            if init.len() != c || init.iter().any(|&t| t as usize >= vocab) {
                return Err(Error::Model(format!(
                    "the initial canvas must be {c} token ids below {vocab}"
                )));
            }
        }
        let ctx = runner.config().ctx;
        if req.prompt.len() + c > ctx {
            return Err(Error::Model(format!(
                "a prompt of {} tokens leaves no room for a canvas of {c} in the context of {ctx}",
                req.prompt.len()
            )));
        }
        let mut sampler = CanvasSampler::new(req.params.clone(), vocab)?;
        let canvas = match &req.init_canvas {
            Some(init) => init.clone(),
            None => sampler.noise(c),
        };
        Ok(CanvasTask {
            remaining: req.params.max_denoising_steps,
            req,
            sampler,
            canvas_len: c,
            prompt_fed: false,
            argmax: canvas.clone(),
            canvas,
            self_cond: None,
            steps: 0,
            sum: DiffusionSummary::default(),
        })
    }

    /// The prompt's length.
    pub fn prompt_len(&self) -> usize {
        self.req.prompt.len()
    }

    /// One forward pass of `seq`'s generation (the sequence is not released here).
    pub fn step(&mut self, runner: &mut Runner, seq: SeqId) -> Result<TaskStep> {
        let mut out = TaskStep::default();
        if !self.prompt_fed {
            // Full blocks the prefix cache holds are taken, not recomputed (the encoder is
            // causal: its K/V for a prefix are the same whoever computed them).
            let p = &self.req.prompt;
            out.cached = runner.start_cached(seq, p, p.len() - 1)?;
            runner.feed(seq, &p[out.cached..], Logits::None)?;
            self.prompt_fed = true;
            out.finished = self.req.max_tokens == 0;
            return Ok(out);
        }
        let t0 = std::time::Instant::now();
        let mut logits = runner.denoise(seq, &self.canvas, self.self_cond.as_deref())?;
        let t1 = std::time::Instant::now();
        let s = self
            .sampler
            .step(&self.canvas, &mut logits, self.remaining)?;
        self.steps += 1;
        self.remaining -= 1;
        self.self_cond = Some(logits.concat());
        self.sum.decoder_seconds += (t1 - t0).as_secs_f64();
        self.sum.host_seconds += t1.elapsed().as_secs_f64();
        self.canvas = s.next;
        self.argmax = s.argmax;
        out.draft = Some(self.argmax.clone());
        if !(s.stop || self.remaining == 0) {
            return Ok(out);
        }
        // The canvas is done.
        self.sum.canvases += 1;
        self.sum.steps += self.steps;
        let mut tokens = self.argmax.clone();
        if let Some(i) = tokens.iter().position(|t| self.req.stop_ids.contains(t)) {
            tokens.truncate(i);
            self.sum.stopped = true;
        }
        tokens.truncate(self.req.max_tokens - self.sum.generated);
        self.sum.generated += tokens.len();
        out.committed = Some((tokens, self.steps));
        let ctx = runner.config().ctx;
        let room = runner.seq_len(seq) + 2 * self.canvas_len <= ctx;
        out.finished = self.sum.stopped || self.sum.generated >= self.req.max_tokens || !room;
        if !out.finished {
            // The encoder commits the canvas: its K/V replace the decoder's scratch.
            runner.feed(seq, &self.argmax, Logits::None)?;
            self.canvas = self.sampler.noise(self.canvas_len);
            self.sampler.reset();
            self.self_cond = None;
            self.remaining = self.req.params.max_denoising_steps;
            self.steps = 0;
        }
        Ok(out)
    }
}

/// The batching engine's diffusion requests: at most `max_running` in the KV cache at once,
/// served in turn a forward pass each; the rest wait their turn in arrival order.
#[derive(Default)]
pub struct Tasks {
    /// Started requests, in turn.
    order: VecDeque<ReqId>,
    /// Requests not started yet.
    queue: VecDeque<ReqId>,
    tasks: HashMap<ReqId, CanvasTask>,
    max_running: usize,
    /// The request whose step is running (its task is out of the map meanwhile).
    pub(super) stepping: Option<ReqId>,
    /// Denoising settings for requests (the checkpoint's `generation_config.json`).
    pub defaults: DiffusionParams,
}

impl Tasks {
    pub(super) fn new(max_running: usize) -> Tasks {
        Tasks {
            max_running: max_running.max(1),
            ..Tasks::default()
        }
    }
    pub fn len(&self) -> usize {
        self.tasks.len()
    }
    /// Requests in the KV cache, and waiting to start.
    pub fn running(&self) -> usize {
        self.tasks.len().min(self.max_running)
    }
    pub fn waiting(&self) -> usize {
        self.tasks.len() - self.running()
    }
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

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
            init_canvas: None,
            stop_ids: req.stop_ids,
        };
        let task = match CanvasTask::new(&self.runner, r) {
            Ok(t) => t,
            Err(e) => return self.fail(id, e.to_string()),
        };
        if let Some(d) = &mut self.diffusion {
            d.tasks.insert(id, task);
            d.queue.push_back(id);
        }
        Ok(())
    }

    /// Forgets `id`'s task (if any) and frees its cache (also when its step failed or
    /// panicked with the task out of the map).
    pub(super) fn drop_diffusion(&mut self, id: ReqId) -> Result<()> {
        let Some(d) = &mut self.diffusion else {
            return Ok(());
        };
        d.tasks.remove(&id);
        if self.runner.has_sequence(id) {
            self.runner.release(id)?;
        }
        Ok(())
    }

    /// One forward pass of the next diffusion request in turn: its tokens go out when a
    /// canvas is committed. Returns false when there is nothing to do.
    pub(super) fn diffusion_step(&mut self) -> Result<bool> {
        let Some(d) = &mut self.diffusion else {
            return Ok(false);
        };
        // Ids of requests ended meanwhile are dropped here; waiting requests start as places
        // free up.
        d.order.retain(|id| d.tasks.contains_key(id));
        while d.order.len() < d.max_running {
            match d.queue.pop_front() {
                Some(id) if d.tasks.contains_key(&id) => d.order.push_back(id),
                Some(_) => continue,
                None => break,
            }
        }
        let id = loop {
            match d.order.pop_front() {
                Some(id) if d.tasks.contains_key(&id) => break id,
                Some(_) => continue,
                None => return Ok(false),
            }
        };
        let Some(mut task) = d.tasks.remove(&id) else {
            return Ok(false);
        };
        d.stepping = Some(id);
        self.stats.steps += 1;
        let fresh = !task.prompt_fed;
        let s = match task.step(&mut self.runner, id) {
            Ok(s) => s,
            Err(e) => {
                if let Some(d) = &mut self.diffusion {
                    d.stepping = None;
                }
                self.fail(id, format!("forward pass failed: {e}"))?;
                return Ok(true);
            }
        };
        let stopped = task.sum.stopped;
        if let Some(d) = &mut self.diffusion {
            d.stepping = None;
        }
        if fresh {
            self.stats.prefix_queried_tokens += task.prompt_len() as u64;
            self.stats.prefix_hit_tokens += s.cached as u64;
            if let (true, Some(a)) = (s.cached > 0, self.active.get_mut(&id)) {
                a.tx.send(Event::Cached(s.cached));
            }
        }
        if let Some(d) = &mut self.diffusion {
            d.tasks.insert(id, task);
            if !s.finished {
                d.order.push_back(id);
            }
        }
        if s.draft.is_some() {
            self.stats.denoising_steps += 1;
        }
        if let Some((tokens, _)) = s.committed {
            self.stats.canvases += 1;
            for tok in tokens {
                self.stats.generated += 1;
                let Some(a) = self.active.get_mut(&id) else {
                    break;
                };
                a.generated += 1;
                if !a.tx.send(Event::Token(tok, None)) {
                    self.stats.cancelled += 1;
                    self.active.remove(&id);
                    self.end(id, None)?;
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
