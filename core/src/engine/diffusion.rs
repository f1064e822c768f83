//! Block-diffusion generation (DiffusionGemma): the prompt is encoded into the KV cache, then
//! canvas after canvas is denoised on the device ([`Runner::denoise_on_device`] and the
//! canvas ops) and committed by an encoder pass over its argmax tokens, until `max_tokens`,
//! an end token inside a canvas, or the context's end.

use std::collections::{HashMap, VecDeque};

use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::op::canvas::MAX_CANVAS;
use crate::rng::Rng;
use crate::runner::{Forward, Logits, Runner, Session};
use crate::sample::diffusion::{step_seeds, DiffusionParams};
use crate::sched::ReqId;
use crate::tensor::Tensor;

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
    /// Whether every step's argmax canvas is read back and reported (a draft).
    pub drafts: bool,
    /// Whether each step waits for the decoder before the sampler (benchmarks: the
    /// summary's decoder and sampler times are then each their own).
    pub timed: bool,
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
    /// Forward passes that fed the prompt (one chunk of at most `max_batch_tokens` each).
    pub prompt_passes: usize,
    /// An end token was met (else `max_tokens` or the context).
    pub stopped: bool,
    /// Seconds in the decoder's forward passes (queued; on an asynchronous device the work
    /// finishes inside the sampler's status read), and from then to the end of the step: the
    /// draw and acceptance ops, the status read and any tokens read back.
    pub decoder_seconds: f64,
    pub sampler_seconds: f64,
    /// Of the steps' time, what the host spent itself (recording or running ops, reading
    /// back, bookkeeping) rather than waiting for the device. On the CPU backend, all of it.
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
    let out = run(&mut runner.session(), seq, req, &mut on);
    let freed = runner.release(seq);
    let out = out?;
    freed?;
    Ok(out)
}

fn run(
    runner: &mut Session<'_>,
    seq: SeqId,
    req: &DiffusionRequest,
    on: &mut impl FnMut(DiffusionEvent) -> Result<bool>,
) -> Result<DiffusionSummary> {
    let mut task = CanvasTask::new(runner.forward(), req.clone())?;
    loop {
        let s = task.step(runner, seq)?;
        if let Some(tokens) = s.draft {
            let draft = DiffusionEvent::Draft {
                canvas: s.canvas,
                step: s.step,
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
    /// The step's argmax canvas, when drafts are wanted (none for the step that only encoded
    /// the prompt).
    pub draft: Option<Vec<u32>>,
    /// Whether this step denoised (else it encoded the prompt), and which canvas (counted
    /// from 0) and step (from 1) it was.
    pub denoised: bool,
    pub canvas: usize,
    pub step: usize,
    /// A canvas committed this step: its tokens (cut at an end token or `max_tokens`) and the
    /// denoising steps it took.
    pub committed: Option<(Vec<u32>, usize)>,
    /// The generation is over (`sum.stopped` says whether an end token ended it).
    pub finished: bool,
    /// Prompt tokens taken from the prefix cache (on the step that encodes the prompt).
    pub cached: usize,
}

/// The denoising state that lives on the device between steps.
struct DeviceCanvas {
    /// The canvas the next step denoises, `[canvas]` i32.
    canvas: Tensor,
    /// The last argmax canvases, `[max(stability, 1), canvas]` i32 (`-1`: none yet).
    history: Tensor,
    /// (accepted, stop), `[2]` i32: the one read per step.
    status: Tensor,
    /// The last step's processed logits (self-conditioning) and argmax.
    processed: Option<Tensor>,
    argmax: Option<Tensor>,
}

/// One diffusion generation as a state machine advanced one forward pass at a time (the
/// prompt's encoding, a denoising step, or a denoising step that ends a canvas and the
/// encoder pass that commits it), so an engine can interleave it with other work. The
/// denoising loop runs on the device ([`crate::op::Op::CanvasDraw`], [`crate::op::Op::CanvasAccept`]): a step reads
/// back a two-word status, and a canvas's tokens once, when it is committed.
pub struct CanvasTask {
    req: DiffusionRequest,
    vocab: usize,
    canvas_len: usize,
    /// Noise for the starting canvases.
    rng: Rng,
    /// Prompt tokens in the cache: `None` before the first step.
    fed: Option<usize>,
    /// The next canvas's starting tokens (taken when its first step runs).
    start: Option<Vec<u32>>,
    dev: Option<DeviceCanvas>,
    /// Denoising steps left for the current canvas, and taken so far.
    remaining: usize,
    steps: usize,
    pub sum: DiffusionSummary,
}

impl CanvasTask {
    /// Whether the prompt is in the cache (its first step encodes it).
    pub fn prompt_fed(&self) -> bool {
        self.fed == Some(self.req.prompt.len())
    }

    /// Whether no step has run yet (the next one looks the prompt up in the prefix cache).
    pub fn fresh(&self) -> bool {
        self.fed.is_none()
    }

    /// Checks `req` against the runner's model and context.
    pub fn new(runner: &Forward, req: DiffusionRequest) -> Result<CanvasTask> {
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
        if c > MAX_CANVAS {
            return Err(Error::Model(format!(
                "a canvas of {c} positions; at most {MAX_CANVAS} are supported"
            )));
        }
        let ctx = runner.config().ctx;
        if req.prompt.len() + c > ctx {
            return Err(Error::Model(format!(
                "a prompt of {} tokens leaves no room for a canvas of {c} in the context of {ctx}",
                req.prompt.len()
            )));
        }
        req.params.validate()?;
        let mut rng = Rng::new(req.params.seed);
        let start = match &req.init_canvas {
            Some(init) => init.clone(),
            None => noise(&mut rng, c, vocab),
        };
        Ok(CanvasTask {
            remaining: req.params.max_denoising_steps,
            req,
            vocab,
            canvas_len: c,
            rng,
            fed: None,
            start: Some(start),
            dev: None,
            steps: 0,
            sum: DiffusionSummary::default(),
        })
    }

    /// The prompt's length.
    pub fn prompt_len(&self) -> usize {
        self.req.prompt.len()
    }

    /// One forward pass of `seq`'s generation (the sequence is not released here).
    pub fn step(&mut self, runner: &mut Session<'_>, seq: SeqId) -> Result<TaskStep> {
        let mut out = TaskStep::default();
        if !self.prompt_fed() {
            // The prompt goes in a chunk of at most `max_batch_tokens` per step, like any
            // other prefill, so no other request waits for all of it. Full blocks the prefix
            // cache holds are taken, not recomputed (the encoder is causal: its K/V for a
            // prefix are the same whoever computed them).
            let p = &self.req.prompt;
            let fed = match self.fed {
                Some(n) => n,
                None => {
                    out.cached = runner.start_cached(seq, p, p.len() - 1)?;
                    out.cached
                }
            };
            let chunk = runner.forward().config().max_batch_tokens.max(1);
            let end = (fed + chunk).min(p.len());
            runner.feed(seq, &p[fed..end], Logits::None)?;
            self.fed = Some(end);
            self.sum.prompt_passes += 1;
            out.finished = end == p.len() && self.req.max_tokens == 0;
            return Ok(out);
        }
        let t0 = std::time::Instant::now();
        let params = &self.req.params;
        let (c, vocab) = (self.canvas_len, self.vocab);
        if let Some(start) = self.start.take() {
            let ex = runner.forward().executor();
            let ids: Vec<i32> = start.iter().map(|&t| t as i32).collect();
            let s = params.stability_threshold.max(1);
            self.dev = Some(DeviceCanvas {
                canvas: ex.upload_i32(&[c], &ids)?,
                history: ex.upload_i32(&[s, c], &vec![-1; s * c])?,
                status: ex.upload_i32(&[2], &[0, 0])?,
                processed: None,
                argmax: None,
            });
        }
        let Some(dev) = self.dev.as_mut() else {
            return Err(Error::Model("a denoising step with no canvas".into()));
        };
        let logits = runner.denoise_on_device(seq, &dev.canvas, dev.processed.as_ref())?;
        let t1 = std::time::Instant::now();
        let ex = runner.forward().executor();
        if self.req.timed {
            ex.backend().synchronize()?;
        }
        let t2 = std::time::Instant::now();
        let (draw_seed, accept_seed) = step_seeds(params.seed, self.sum.canvases, self.steps);
        let draw = params.draw_op(self.remaining, draw_seed);
        let (processed, argmax, drawn, entropy) = ex.canvas_draw(&draw, &logits)?;
        ex.canvas_accept(
            &params.accept_op(vocab, accept_seed),
            [&argmax, &drawn, &entropy],
            &dev.canvas,
            &dev.history,
            &dev.status,
        )?;
        let t3 = std::time::Instant::now();
        // The step's one read: accepted positions and whether to stop.
        let status = ex.download_i32(&dev.status)?;
        let t4 = std::time::Instant::now();
        let stop = status.get(1).is_some_and(|&s| s != 0);
        if self.req.drafts {
            out.draft = Some(tokens(&ex.download_i32(&argmax)?));
        }
        dev.processed = Some(processed);
        dev.argmax = Some(argmax);
        out.denoised = true;
        out.canvas = self.sum.canvases;
        self.steps += 1;
        out.step = self.steps;
        self.remaining -= 1;
        let t5 = std::time::Instant::now();
        self.sum.decoder_seconds += (t2 - t0).as_secs_f64();
        self.sum.sampler_seconds += (t5 - t2).as_secs_f64();
        self.sum.host_seconds += ((t1 - t0) + (t3 - t2) + (t5 - t4)).as_secs_f64();
        if !(stop || self.remaining == 0) {
            return Ok(out);
        }
        // The canvas is done: its argmax is read back and committed.
        let argmax = match &dev.argmax {
            Some(a) => tokens(&ex.download_i32(a)?),
            None => return Err(Error::Model("a finished canvas with no argmax".into())),
        };
        self.sum.canvases += 1;
        self.sum.steps += self.steps;
        let mut kept = argmax.clone();
        if let Some(i) = kept.iter().position(|t| self.req.stop_ids.contains(t)) {
            kept.truncate(i);
            self.sum.stopped = true;
        }
        kept.truncate(self.req.max_tokens - self.sum.generated);
        self.sum.generated += kept.len();
        out.committed = Some((kept, self.steps));
        let ctx = runner.forward().config().ctx;
        let room = runner.seq_len(seq) + 2 * self.canvas_len <= ctx;
        out.finished = self.sum.stopped || self.sum.generated >= self.req.max_tokens || !room;
        if !out.finished {
            // The encoder commits the canvas: its K/V replace the decoder's scratch.
            runner.feed(seq, &argmax, Logits::None)?;
            self.start = Some(noise(&mut self.rng, c, vocab));
            self.dev = None;
            self.remaining = self.req.params.max_denoising_steps;
            self.steps = 0;
        }
        Ok(out)
    }
}

/// `n` uniformly random tokens below `vocab`.
fn noise(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

/// Token ids read back from the device (the ops write ids below the vocabulary).
fn tokens(ids: &[i32]) -> Vec<u32> {
    ids.iter().map(|&t| t.max(0) as u32).collect()
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
    stepping: Option<ReqId>,
    /// Denoising settings for requests (the checkpoint's `generation_config.json`).
    pub defaults: DiffusionParams,
}

impl Tasks {
    pub fn new(max_running: usize) -> Tasks {
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

    /// Queues a checked request's task behind the others.
    pub fn push(&mut self, id: ReqId, task: CanvasTask) {
        self.tasks.insert(id, task);
        self.queue.push_back(id);
    }

    /// Forgets `id`'s task, if it has one.
    pub fn remove(&mut self, id: ReqId) {
        self.tasks.remove(&id);
    }

    /// The task whose turn it is (taken out of the map while it steps: hand it back with
    /// [`Tasks::put_back`]). Ids of requests ended meanwhile are dropped; waiting requests
    /// start as places free up.
    pub fn take_next(&mut self) -> Option<(ReqId, CanvasTask)> {
        let tasks = &self.tasks;
        self.order.retain(|id| tasks.contains_key(id));
        while self.order.len() < self.max_running {
            match self.queue.pop_front() {
                Some(id) if self.tasks.contains_key(&id) => self.order.push_back(id),
                Some(_) => continue,
                None => break,
            }
        }
        let id = loop {
            match self.order.pop_front() {
                Some(id) if self.tasks.contains_key(&id) => break id,
                Some(_) => continue,
                None => return None,
            }
        };
        let task = self.tasks.remove(&id)?;
        self.stepping = Some(id);
        Some((id, task))
    }

    /// Hands back the task [`Tasks::take_next`] gave out after its step (`None`: the step
    /// failed). An unfinished one takes its turn again after the others.
    pub fn put_back(&mut self, id: ReqId, task: Option<(CanvasTask, bool)>) {
        self.stepping = None;
        if let Some((task, finished)) = task {
            self.tasks.insert(id, task);
            if !finished {
                self.order.push_back(id);
            }
        }
    }

    /// The request whose step was running when it panicked (its task is lost).
    pub fn take_stepping(&mut self) -> Option<ReqId> {
        self.stepping.take()
    }
}
