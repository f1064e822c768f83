//! `kiln run` and `kiln logits` for block-diffusion models (DiffusionGemma): the denoising
//! settings (flags over the checkpoint's `generation_config.json`, over transformers'
//! defaults), generation canvas by canvas, and one decoder step's logits.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_core::engine::diffusion::{generate, DiffusionRequest};
use kiln_core::engine::{Engine, Event, GenRequest, Logits};
use kiln_core::sample::diffusion::DiffusionParams;
use kiln_core::sample::SamplingParams;
use kiln_core::tokenizer::StreamDecoder;
use serde::Serialize;
use serde_json::Value;

use crate::load::Loaded;

/// Denoising settings of a diffusion model (ignored by others). Unset ones come from the
/// checkpoint's `generation_config.json`, else transformers' defaults.
#[derive(clap::Args, Debug, Default)]
pub struct DiffusionArgs {
    /// Most denoising steps per canvas [default: 48].
    #[arg(long)]
    pub max_denoising_steps: Option<usize>,
    /// Temperature at the last denoising step [default: 0.4].
    #[arg(long)]
    pub t_min: Option<f32>,
    /// Temperature at the first denoising step [default: 0.8].
    #[arg(long)]
    pub t_max: Option<f32>,
    /// Accept the lowest-entropy positions while their summed entropy, less the largest,
    /// stays within this (nats); higher accepts more per step [default: 0.1].
    #[arg(long)]
    pub entropy_bound: Option<f32>,
    /// Stop denoising a canvas once its argmax has held this many steps (and is confident)
    /// [default: 1].
    #[arg(long)]
    pub stability_threshold: Option<usize>,
    /// ... and the mean entropy is under this [default: 0.005].
    #[arg(long)]
    pub confidence_threshold: Option<f32>,
    /// The first canvas's starting token ids, comma-separated (one per canvas position;
    /// default: uniform noise).
    #[arg(long, value_delimiter = ',')]
    pub init_canvas: Option<Vec<u32>>,
}

impl DiffusionArgs {
    /// The settings: these flags, over the checkpoint's `generation_config.json` (a model
    /// directory's), over transformers' defaults.
    pub fn params(&self, model: &Path, seed: Option<u64>) -> Result<DiffusionParams> {
        let mut p = DiffusionParams::default();
        let gc = model.join("generation_config.json");
        if model.is_dir() && gc.is_file() {
            let raw = std::fs::read(&gc).with_context(|| format!("reading {}", gc.display()))?;
            let v: Value = serde_json::from_slice(&raw)
                .with_context(|| format!("{} is not JSON", gc.display()))?;
            let f = |k: &str| v.get(k).and_then(Value::as_f64);
            if let Some(x) = v.get("max_denoising_steps").and_then(Value::as_u64) {
                p.max_denoising_steps = x.min(100_000) as usize;
            }
            if let Some(x) = f("t_min") {
                p.t_min = x as f32;
            }
            if let Some(x) = f("t_max") {
                p.t_max = x as f32;
            }
            if let Some(x) = v
                .get("sampler_config")
                .and_then(|s| s.get("entropy_bound"))
                .and_then(Value::as_f64)
            {
                p.entropy_bound = x as f32;
            }
            if let Some(x) = v.get("stability_threshold").and_then(Value::as_u64) {
                p.stability_threshold = x.min(100_000) as usize;
            }
            if let Some(x) = f("confidence_threshold") {
                p.confidence_threshold = x as f32;
            }
        }
        if let Some(x) = self.max_denoising_steps {
            p.max_denoising_steps = x;
        }
        if let Some(x) = self.t_min {
            p.t_min = x;
        }
        if let Some(x) = self.t_max {
            p.t_max = x;
        }
        if let Some(x) = self.entropy_bound {
            p.entropy_bound = x;
        }
        if let Some(x) = self.stability_threshold {
            p.stability_threshold = x;
        }
        if let Some(x) = self.confidence_threshold {
            p.confidence_threshold = x;
        }
        p.seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        p.validate()?;
        Ok(p)
    }
}

#[derive(Serialize)]
struct RunJson {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    canvases: usize,
    denoising_steps: usize,
    /// Generated tokens per second, and seconds per denoising step.
    tokens_per_second: f64,
    seconds_per_step: f64,
}

/// `kiln run` on a diffusion model: canvases printed as they are committed. The request
/// runs in the batching engine, as a served one does.
pub fn run(
    m: Loaded,
    ids: Vec<u32>,
    n: usize,
    args: &DiffusionArgs,
    seed: Option<u64>,
    stop_ids: Vec<u32>,
    json: bool,
) -> Result<()> {
    let params = args.params(&m.path, seed)?;
    let tok = m.tokenizer;
    let mut engine = Engine::new(m.runner, 1);
    let seed = params.seed;
    engine.set_diffusion_defaults(params)?;
    let req = GenRequest {
        stop_ids,
        init_canvas: args.init_canvas.clone(),
        ..GenRequest::new(
            ids.clone(),
            SamplingParams {
                seed: Some(seed),
                ..SamplingParams::default()
            },
            n,
        )
    };
    let mut stdout = std::io::stdout().lock();
    let mut dec = StreamDecoder::new();
    let (mut tokens, mut text) = (Vec::new(), String::new());
    let (mut canvases, mut steps) = (0, 0);
    let t0 = Instant::now();
    let io = |e: std::io::Error| kiln_core::Error::Model(format!("writing the output: {e}"));
    engine.run_one(req, |ev| {
        match ev {
            Event::Canvas { steps: s } => {
                canvases += 1;
                steps += s;
            }
            Event::Token(id, _) => {
                let piece = dec.push(&tok, id);
                if json {
                    text.push_str(&piece);
                } else {
                    stdout.write_all(piece.as_bytes()).map_err(io)?;
                    stdout.flush().map_err(io)?;
                }
                tokens.push(id);
            }
            _ => {}
        }
        Ok(true)
    })?;
    let tail = dec.finish();
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    if json {
        text.push_str(&tail);
        let j = RunJson {
            prompt_tokens: ids,
            tokens_per_second: tokens.len() as f64 / secs,
            tokens,
            text,
            canvases,
            denoising_steps: steps,
            seconds_per_step: secs / steps.max(1) as f64,
        };
        writeln!(stdout, "{}", serde_json::to_string(&j)?)?;
    } else {
        writeln!(stdout, "{tail}")?;
    }
    Ok(())
}

/// `kiln logits --canvas`: one decoder step's logits over `canvas` after `prompt`, with the
/// self-conditioning logits in `self_cond` (a JSON array of canvas × vocabulary numbers).
pub fn logits(
    m: &mut Loaded,
    prompt: &[u32],
    canvas: &[u32],
    self_cond: Option<&Path>,
) -> Result<Vec<Vec<f32>>> {
    let Some(c) = m.runner.model().canvas_length() else {
        bail!("--canvas needs a block-diffusion model; this one generates token by token");
    };
    if canvas.len() != c {
        bail!(
            "--canvas has {} ids; this model's canvas holds {c}",
            canvas.len()
        );
    }
    let sc = match self_cond {
        Some(p) => {
            let raw = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            let v: Vec<Vec<f32>> = serde_json::from_slice(&raw).with_context(|| {
                format!(
                    "{}: expected a JSON array of {c} rows of logits",
                    p.display()
                )
            })?;
            let vocab = m.runner.model().info().vocab;
            if v.len() != c || v.iter().any(|r| r.len() != vocab) {
                bail!(
                    "{}: {} rows; the canvas needs {c} rows of {vocab} logits",
                    p.display(),
                    v.len()
                );
            }
            Some(v.concat())
        }
        None => None,
    };
    if !prompt.is_empty() {
        m.runner.feed(1, prompt, Logits::None)?;
    }
    Ok(m.runner.denoise(1, canvas, sc.as_deref())?)
}

/// `kiln bench` on a diffusion model: a prompt of `n_prompt` random tokens, then canvases
/// denoised for exactly `steps` steps each (no early stop) until `n_gen` tokens, `reps`
/// times: seconds per denoising step (the decoder's and the sampler's, each waited for),
/// tokens per second per canvas, and the share of step time the host spent working rather
/// than waiting for the device (all of it on the CPU backend).
pub fn bench(
    m: &mut Loaded,
    n_prompt: usize,
    n_gen: usize,
    reps: usize,
    steps: usize,
) -> Result<Value> {
    let c = m.runner.model().canvas_length().unwrap_or(1);
    let vocab = m.runner.model().info().vocab as u64;
    let mut rng = kiln_core::rng::Rng::new(42);
    let params = DiffusionParams {
        max_denoising_steps: steps.max(1),
        // Never stable-and-confident: every canvas takes every step.
        stability_threshold: 100_000,
        confidence_threshold: f32::MIN_POSITIVE,
        seed: 42,
        ..DiffusionParams::default()
    };
    let backend = m.runner.executor().backend().name().to_string();
    let mut rows = Vec::new();
    // One warm-up run, then the timed ones.
    for rep in 0..=reps.max(1) {
        let req = DiffusionRequest {
            prompt: (0..n_prompt.max(1))
                .map(|_| (rng.next_u64() % vocab) as u32)
                .collect(),
            max_tokens: n_gen.max(1),
            params: params.clone(),
            init_canvas: None,
            stop_ids: Vec::new(),
            drafts: false,
            timed: true,
        };
        let sum = generate(&mut m.runner, 1, &req, |_| Ok(true))?;
        if rep == 0 {
            continue;
        }
        let n = sum.steps.max(1) as f64;
        let total = (sum.decoder_seconds + sum.sampler_seconds).max(1e-12);
        rows.push([
            total / n,
            sum.decoder_seconds / n,
            sum.sampler_seconds / n,
            sum.host_seconds / total,
        ]);
    }
    let mean = |k: usize| rows.iter().map(|r| r[k]).sum::<f64>() / rows.len().max(1) as f64;
    let (step, host) = (mean(0), mean(3));
    let per_canvas = step * params.max_denoising_steps as f64;
    Ok(serde_json::json!({
        "backend": backend,
        "canvas": c,
        "denoising_steps": params.max_denoising_steps,
        "prompt_tokens": n_prompt,
        "generated_tokens": n_gen,
        "seconds_per_step": step,
        "decoder_seconds_per_step": mean(1),
        "sampler_seconds_per_step": mean(2),
        "tokens_per_second_per_canvas": c as f64 / per_canvas.max(1e-12),
        "host_share": host,
    }))
}
