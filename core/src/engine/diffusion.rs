//! Block-diffusion generation (DiffusionGemma): the prompt is encoded into the KV cache, then
//! canvas after canvas is denoised ([`Runner::denoise`] and the [`CanvasSampler`]) and
//! committed by an encoder pass over its argmax tokens, until `max_tokens`, an end token
//! inside a canvas, or the context's end.

use super::{Logits, Runner};
use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::sample::diffusion::{CanvasSampler, DiffusionParams};

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
    runner.feed(seq, &req.prompt, Logits::None)?;
    let mut sum = DiffusionSummary::default();
    let n_steps = req.params.max_denoising_steps;
    while sum.generated < req.max_tokens && runner.seq_len(seq) + c <= ctx {
        let mut canvas = match (&req.init_canvas, sum.canvases) {
            (Some(init), 0) => init.clone(),
            _ => sampler.noise(c),
        };
        sampler.reset();
        let mut self_cond: Option<Vec<f32>> = None;
        let mut argmax = canvas.clone();
        let mut steps = 0;
        for remaining in (1..=n_steps).rev() {
            let t0 = std::time::Instant::now();
            let mut logits = runner.denoise(seq, &canvas, self_cond.as_deref())?;
            let t1 = std::time::Instant::now();
            let out = sampler.step(&canvas, &mut logits, remaining)?;
            steps += 1;
            self_cond = Some(logits.concat());
            sum.decoder_seconds += (t1 - t0).as_secs_f64();
            sum.host_seconds += t1.elapsed().as_secs_f64();
            canvas = out.next;
            argmax = out.argmax;
            let draft = DiffusionEvent::Draft {
                canvas: sum.canvases,
                step: steps,
                tokens: argmax.clone(),
            };
            if !on(draft)? {
                return Ok(sum);
            }
            if out.stop {
                break;
            }
        }
        sum.canvases += 1;
        sum.steps += steps;
        let mut tokens = argmax.clone();
        if let Some(i) = tokens.iter().position(|t| req.stop_ids.contains(t)) {
            tokens.truncate(i);
            sum.stopped = true;
        }
        tokens.truncate(req.max_tokens - sum.generated);
        sum.generated += tokens.len();
        let more = on(DiffusionEvent::Canvas { tokens, steps })?;
        if !more || sum.stopped || sum.generated >= req.max_tokens {
            break;
        }
        // The encoder commits the canvas: its K/V replace the decoder's scratch.
        runner.feed(seq, &argmax, Logits::None)?;
    }
    Ok(sum)
}
