//! Block-diffusion generation (DiffusionGemma): the prompt is encoded into the KV cache, then
//! canvas after canvas is denoised on the device (a denoising pass, then the canvas ops) and
//! committed by an encoder pass over its argmax tokens, until `max_tokens`, an end token
//! inside a canvas, or the context's end.
//!
//! [`Canvas`] is one request's denoising state between passes. The batching engine plans its
//! passes like any other request's (the scheduler feeds the prompt and each committed canvas
//! as prefill chunks and plans a denoising item once everything is in the cache; several
//! requests' canvases share a pass with other requests' tokens); [`generate`] drives one
//! request directly on a [`Runner`] (tools and benchmarks).

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::kv::SeqId;
use crate::model::CanvasInput;
use crate::op::canvas::MAX_CANVAS;
use crate::rng::Rng;
use crate::runner::{Forward, Logits, Runner, Session};
use crate::sample::diffusion::{step_seeds, DiffusionParams};
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
    let mut sum = DiffusionSummary::default();
    let out = run(&mut runner.session(), seq, req, &mut sum, &mut on);
    let freed = runner.release(seq);
    out?;
    freed?;
    Ok(sum)
}

fn run(
    runner: &mut Session<'_>,
    seq: SeqId,
    req: &DiffusionRequest,
    sum: &mut DiffusionSummary,
    on: &mut impl FnMut(DiffusionEvent) -> Result<bool>,
) -> Result<()> {
    let fwd: &Forward = runner.fwd;
    let ex = fwd.executor();
    let mut canvas = Canvas::new(fwd, req)?;
    // The prompt goes in chunks of at most `max_batch_tokens`; full blocks the prefix cache
    // holds are taken, not recomputed (the encoder is causal).
    let p = &req.prompt;
    let mut fed = runner.start_cached(seq, p, p.len() - 1)?;
    let chunk = fwd.config().max_batch_tokens.max(1);
    while fed < p.len() {
        let end = (fed + chunk).min(p.len());
        runner.feed(seq, &p[fed..end], Logits::None)?;
        sum.prompt_passes += 1;
        fed = end;
    }
    if req.max_tokens == 0 {
        return Ok(());
    }
    let ctx = fwd.config().ctx;
    loop {
        let t0 = crate::time::Instant::now();
        canvas.prepare(ex)?;
        let input = canvas.input()?;
        let logits = runner.denoise_on_device(seq, input.ids, input.self_cond)?;
        let t1 = crate::time::Instant::now();
        if req.timed {
            ex.backend().synchronize()?;
        }
        let t2 = crate::time::Instant::now();
        let s = canvas.after(ex, &logits)?;
        let t3 = crate::time::Instant::now();
        sum.decoder_seconds += (t2 - t0).as_secs_f64();
        sum.sampler_seconds += (t3 - t2).as_secs_f64();
        sum.host_seconds += ((t1 - t0) + s.host).as_secs_f64();
        if let Some(tokens) = s.draft {
            let draft = DiffusionEvent::Draft {
                canvas: s.canvas,
                step: s.step,
                tokens,
            };
            if !on(draft)? {
                return Ok(());
            }
        }
        let Some(argmax) = s.committed else {
            continue;
        };
        sum.canvases += 1;
        sum.steps += s.step;
        let mut kept = argmax.clone();
        if let Some(i) = kept.iter().position(|t| req.stop_ids.contains(t)) {
            kept.truncate(i);
            sum.stopped = true;
        }
        kept.truncate(req.max_tokens - sum.generated);
        sum.generated += kept.len();
        let tokens = kept;
        let more = on(DiffusionEvent::Canvas {
            tokens,
            steps: s.step,
        })?;
        let room = runner.seq_len(seq) + 2 * canvas.len() <= ctx;
        if !more || sum.stopped || sum.generated >= req.max_tokens || !room {
            return Ok(());
        }
        // The encoder commits the canvas: its K/V replace the decoder's scratch.
        runner.feed(seq, &argmax, Logits::None)?;
    }
}

/// What one denoising step of a [`Canvas`] gave.
#[derive(Clone, Debug, Default)]
pub struct Denoised {
    /// The step's argmax canvas, when drafts are wanted.
    pub draft: Option<Vec<u32>>,
    /// Which canvas (counted from 0) and step (from 1) it was.
    pub canvas: usize,
    pub step: usize,
    /// The canvas is done: its argmax tokens, all of them (to be committed; an end token or
    /// `max_tokens` cuts what goes out).
    pub committed: Option<Vec<u32>>,
    /// Of the step's time after the pass, what the host spent itself (recording ops,
    /// reading back) rather than waiting for the device.
    pub host: std::time::Duration,
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

/// One diffusion request's denoising state between passes: the canvas on the device, its
/// history and status, the last step's processed logits, and how many steps it has left.
/// Each step is a pass over [`Canvas::input`] (its logits stay on the device), then
/// [`Canvas::after`], which runs the draw and acceptance ops ([`crate::op::CanvasOp::CanvasDraw`],
/// [`crate::op::CanvasOp::CanvasAccept`]) and reads back a two-word status, and a canvas's tokens
/// once, when it is done.
pub struct Canvas {
    params: DiffusionParams,
    drafts: bool,
    vocab: usize,
    len: usize,
    /// Noise for the starting canvases.
    rng: Rng,
    /// The next canvas's starting tokens (taken when its first step runs).
    start: Option<Vec<u32>>,
    dev: Option<DeviceCanvas>,
    /// Denoising steps left for the current canvas, and taken so far.
    remaining: usize,
    steps: usize,
    /// Canvases done.
    done: usize,
}

impl Canvas {
    /// Checks `req` against the model and the runner's context and batch limits.
    pub fn new(fwd: &Forward, req: &DiffusionRequest) -> Result<Canvas> {
        let c = fwd
            .model()
            .canvas_length()
            .ok_or_else(|| Error::Model("this model does not generate by diffusion".into()))?;
        let vocab = fwd.model().info().vocab;
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
        let cfg = fwd.config();
        if c > cfg.max_batch_tokens {
            return Err(Error::Model(format!(
                "a canvas of {c} tokens exceeds the batch limit of {}",
                cfg.max_batch_tokens
            )));
        }
        if req.prompt.len() + c > cfg.ctx {
            return Err(Error::Model(format!(
                "a prompt of {} tokens leaves no room for a canvas of {c} in the context of {}",
                req.prompt.len(),
                cfg.ctx
            )));
        }
        req.params.validate()?;
        let mut rng = Rng::new(req.params.seed);
        let start = match &req.init_canvas {
            Some(init) => init.clone(),
            None => noise(&mut rng, c, vocab),
        };
        Ok(Canvas {
            remaining: req.params.max_denoising_steps,
            params: req.params.clone(),
            drafts: req.drafts,
            vocab,
            len: c,
            rng,
            start: Some(start),
            dev: None,
            steps: 0,
            done: 0,
        })
    }

    /// Positions per canvas.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Puts a new canvas's starting tokens on the device (before its first step).
    pub fn prepare(&mut self, ex: &Executor) -> Result<()> {
        let Some(start) = self.start.take() else {
            return Ok(());
        };
        let c = self.len;
        let ids: Vec<i32> = start.iter().map(|&t| t as i32).collect();
        let s = self.params.stability_threshold.max(1);
        self.dev = Some(DeviceCanvas {
            canvas: ex.upload_i32(&[c], &ids)?,
            history: ex.upload_i32(&[s, c], &vec![-1; s * c])?,
            status: ex.upload_i32(&[2], &[0, 0])?,
            processed: None,
            argmax: None,
        });
        Ok(())
    }

    /// What the next denoising pass reads: the canvas's ids and the last step's processed
    /// logits (after [`Canvas::prepare`]).
    pub fn input(&self) -> Result<CanvasInput<'_>> {
        let dev = (self.dev.as_ref())
            .ok_or_else(|| Error::Model("a denoising step with no canvas".into()))?;
        Ok(CanvasInput {
            ids: &dev.canvas,
            self_cond: dev.processed.as_ref(),
        })
    }

    /// After the pass: the draw and acceptance ops over the canvas's `logits`
    /// (`[canvas, vocab]`), and the step's status read. A canvas that is done is read back
    /// and the next one starts from noise.
    pub fn after(&mut self, ex: &Executor, logits: &Tensor) -> Result<Denoised> {
        let t0 = crate::time::Instant::now();
        let Some(dev) = self.dev.as_mut() else {
            return Err(Error::Model("a denoising step with no canvas".into()));
        };
        let params = &self.params;
        let (draw_seed, accept_seed) = step_seeds(params.seed, self.done, self.steps);
        let draw = params.draw_op(self.remaining, draw_seed);
        let (processed, argmax, drawn, entropy) = ex.canvas_draw(&draw, logits)?;
        ex.canvas_accept(
            &params.accept_op(self.vocab, accept_seed),
            [&argmax, &drawn, &entropy],
            &dev.canvas,
            &dev.history,
            &dev.status,
        )?;
        let t1 = crate::time::Instant::now();
        // The step's one read: accepted positions and whether to stop.
        let status = ex.download_i32(&dev.status)?;
        let t2 = crate::time::Instant::now();
        let stop = status.get(1).is_some_and(|&s| s != 0);
        let mut out = Denoised {
            draft: match self.drafts {
                true => Some(tokens(&ex.download_i32(&argmax)?)),
                false => None,
            },
            canvas: self.done,
            ..Denoised::default()
        };
        dev.processed = Some(processed);
        dev.argmax = Some(argmax);
        self.steps += 1;
        out.step = self.steps;
        self.remaining = self.remaining.saturating_sub(1);
        if stop || self.remaining == 0 {
            // The canvas is done: its argmax is read back; the next starts from noise.
            let argmax = match &dev.argmax {
                Some(a) => tokens(&ex.download_i32(a)?),
                None => return Err(Error::Model("a finished canvas with no argmax".into())),
            };
            out.committed = Some(argmax);
            self.done += 1;
            self.start = Some(noise(&mut self.rng, self.len, self.vocab));
            self.dev = None;
            self.remaining = self.params.max_denoising_steps;
            self.steps = 0;
        }
        out.host = (t1 - t0) + t2.elapsed();
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
