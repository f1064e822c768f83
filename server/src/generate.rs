//! The model commands: run, chat, tokenize, logits, perplexity, bench.

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_core::chat::Message;
use kiln_core::engine::{Engine, Event, GenRequest};
use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::grammar::{GrammarSpec, Grammars};
use kiln_core::kv::SeqId;
use kiln_core::sample::{log_softmax, SamplingParams, StopMatcher};
use kiln_core::tokenizer::{StreamDecoder, Tokenizer};
use serde::Serialize;

use crate::load::{load, ModelArgs};
use crate::timings::Timings;

pub use crate::bench::{bench, BenchArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this total probability (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens seen in the last 64 (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep going past the model's end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Constrain the output to a grammar: `json` (any JSON object), `regex:EXPR`, a `.json`
    /// file (a JSON schema) or any other file (a Lark grammar, llguidance's dialect). The
    /// output ends when the grammar is complete.
    #[arg(long, value_name = "SPEC")]
    pub grammar: Option<String>,
}

impl SampleArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: 64,
            seed: self.seed,
            logit_bias: Vec::new(),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The prompt (read from standard input when absent).
    pub prompt: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_predict: usize,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Print {"prompt_tokens":[…],"tokens":[…],"text":"…","timings":{…}} instead of streaming
    /// text.
    #[arg(long)]
    pub json: bool,
    /// After the text, print the prompt and generation speed to standard error.
    #[arg(long)]
    pub timings: bool,
    #[command(flatten)]
    pub diffusion: crate::diffusion::DiffusionArgs,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// An image for a model with a vision tower (repeat for several). The prompt marks
    /// where each goes with the model's image marker (Gemma 3: `<start_of_image>`, Gemma 4:
    /// `<|image|>`, Qwen3.5: `<|image_pad|>`); a prompt without markers gets the images before
    /// its text.
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<std::path::PathBuf>,
}

#[derive(Serialize)]
struct RunJson {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    /// As `kiln serve` reports them (llama.cpp's `timings`).
    timings: serde_json::Value,
    /// Decode steps replayed from recorded graphs (0 on a backend without them, or with
    /// `KILN_GRAPHS=0`).
    graph_steps: u64,
}

const SEQ: SeqId = 1;

/// The request `kiln run` and `chat` hand the engine.
fn request(
    tok: &Tokenizer,
    vocab: usize,
    prompt: &[u32],
    n: usize,
    sample: &SampleArgs,
    images: Vec<kiln_core::engine::PromptImage>,
) -> Result<GenRequest> {
    if prompt.is_empty() {
        bail!("the prompt is empty (and the model adds no BOS token)");
    }
    let constraint = match &sample.grammar {
        Some(g) => {
            let spec = GrammarSpec::parse_arg(g)?;
            Some(Grammars::new(tok, vocab)?.compile(&spec)?)
        }
        None => None,
    };
    Ok(GenRequest {
        prompt: prompt.to_vec(),
        params: sample.params(),
        max_tokens: n,
        stop_ids: if sample.ignore_eos {
            Vec::new()
        } else {
            tok.eog_ids().to_vec()
        },
        logprobs: None,
        drafts: false,
        init_canvas: None,
        autoregressive: false,
        constraint,
        images,
    })
}

/// What [`generate`] made: the token ids, how many prompt tokens came from the prefix cache,
/// and when the tokens came.
pub struct Generated {
    pub tokens: Vec<u32>,
    pub cached: usize,
    pub timings: Timings,
}

/// Generates up to `n` tokens after `prompt` as one request of `engine` (the engine `kiln
/// serve` runs), calling `emit` with each piece of visible text.
pub fn generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    (prompt, images): (&[u32], Vec<kiln_core::engine::PromptImage>),
    n: usize,
    sample: &SampleArgs,
    mut emit: impl FnMut(&str) -> Result<()>,
) -> Result<Generated> {
    let vocab = engine.forward().model().info().vocab;
    let req = request(tok, vocab, prompt, n, sample, images)?;
    let mut timings = Timings::start(prompt.len());
    let mut out = Vec::new();
    let mut cached = 0;
    let mut stream = StreamDecoder::new();
    let mut stops = StopMatcher::new(&sample.stop);
    let mut failed: Option<anyhow::Error> = None;
    engine.run_one(req, |ev| {
        match ev {
            Event::Token(t, _) => {
                timings.token();
                out.push(t);
                if let Err(e) = emit(&stops.push(&stream.push(tok, t))) {
                    failed = Some(e);
                    return Ok(false);
                }
                return Ok(!stops.stopped());
            }
            Event::Cached(c) => cached = c,
            Event::Done { .. }
            | Event::Error(_)
            | Event::Draft { .. }
            | Event::Canvas { .. }
            | Event::Embedding(_) => {}
        }
        Ok(true)
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let tail = stream.finish();
    emit(&stops.push(&tail))?;
    emit(&stops.finish())?;
    Ok(Generated {
        tokens: out,
        cached,
        timings,
    })
}

fn read_prompt(p: &Option<String>) -> Result<String> {
    match p {
        Some(p) => Ok(p.clone()),
        None => {
            let mut s = String::new();
            std::io::stdin().lock().read_to_string_lossy(&mut s)?;
            Ok(s)
        }
    }
}

trait ReadLossy {
    fn read_to_string_lossy(&mut self, s: &mut String) -> std::io::Result<()>;
}
impl<R: std::io::Read> ReadLossy for R {
    fn read_to_string_lossy(&mut self, s: &mut String) -> std::io::Result<()> {
        let mut b = Vec::new();
        self.read_to_end(&mut b)?;
        s.push_str(&String::from_utf8_lossy(&b));
        Ok(())
    }
}

pub fn run(a: &RunArgs) -> Result<()> {
    let prompt = read_prompt(&a.prompt)?;
    let mut cfg = RunnerConfig::default();
    a.spec.prepare(&mut cfg)?;
    let m = load(&a.model, cfg)?;
    let (ids, images) = run_prompt(&m, &prompt, &a.images)?;
    let ctx = m.runner.config().ctx;
    let room = ctx.saturating_sub(ids.len());
    if room == 0 {
        bail!(
            "the prompt has {} tokens, which fills the context of {ctx}",
            ids.len()
        );
    }
    let n = a.n_predict.min(room);
    if m.runner.model().canvas_length().is_some() {
        let stop = match a.sample.ignore_eos {
            true => Vec::new(),
            false => m.tokenizer.eog_ids().to_vec(),
        };
        let seed = a.sample.seed;
        return crate::diffusion::run(m, ids, n, &a.diffusion, seed, stop, a.json);
    }
    let tok = m.tokenizer;
    let mut engine = a.spec.attach(crate::load::with_vision(
        Engine::new(m.runner, 1),
        &m.vision,
    ))?;
    let mut stdout = std::io::stdout().lock();
    let mut text = String::new();
    let json = a.json;
    let got = generate(&mut engine, &tok, (&ids, images), n, &a.sample, |piece| {
        if json {
            text.push_str(piece);
        } else {
            stdout.write_all(piece.as_bytes())?;
            stdout.flush()?;
        }
        Ok(())
    })?;
    if json {
        let j = RunJson {
            prompt_tokens: ids,
            tokens: got.tokens,
            text,
            timings: got.timings.json(),
            graph_steps: engine.forward().graph_stats().replayed,
        };
        writeln!(stdout, "{}", serde_json::to_string(&j)?)?;
    } else {
        writeln!(stdout)?;
        if a.timings {
            eprintln!("kiln: {}", got.timings.line());
            let s = engine.stats();
            if s.images_encoded > 0 {
                eprintln!(
                    "kiln: {} image{} encoded in {:.0} ms",
                    s.images_encoded,
                    if s.images_encoded == 1 { "" } else { "s" },
                    s.image_encode_us as f64 / 1e3
                );
            }
        }
    }
    Ok(())
}

/// `kiln run`'s prompt ids, and its `--image` files placed in it.
fn run_prompt(
    m: &crate::load::Loaded,
    prompt: &str,
    files: &[std::path::PathBuf],
) -> Result<(Vec<u32>, Vec<kiln_core::engine::PromptImage>)> {
    if files.is_empty() {
        return Ok((m.tokenizer.encode(prompt, true)?, Vec::new()));
    }
    let Some((tower, token)) = &m.vision else {
        bail!("--image needs a model with a vision tower (a GGUF's is its mmproj file: --mmproj)");
    };
    let images = files
        .iter()
        .map(|f| crate::images::read_file(f))
        .collect::<Result<Vec<_>>>()?;
    let text = match prompt.contains(tower.marker.as_str()) {
        true => prompt.to_string(),
        false => format!("{}{prompt}", tower.marker.repeat(images.len())),
    };
    crate::images::place(&m.tokenizer, (tower, *token), &text, &images, false)
        .map_err(|e| anyhow::anyhow!(e))
}

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    pub text: String,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn tokenize(a: &TokenizeArgs) -> Result<()> {
    let path = crate::models::resolve(a.model.model.as_deref())?;
    let file = kiln_core::load::open_model(&path)?;
    let tok = kiln_core::tokenizer::open_tokenizer(&path, &file)?;
    println!("{}", serde_json::to_string(&tok.encode(&a.text, true)?)?);
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct LogitsArgs {
    /// Comma-separated token ids, e.g. 1,2,3 (with --canvas: the prompt before the canvas).
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<u32>,
    /// Logits of every position, not just the last.
    #[arg(long)]
    pub all: bool,
    /// A block-diffusion model: one decoder step over this canvas (comma-separated ids, one
    /// per canvas position) after --tokens; prints one row per canvas position.
    #[arg(long, value_delimiter = ',')]
    pub canvas: Option<Vec<u32>>,
    /// With --canvas: the previous step's processed logits for self-conditioning, a JSON
    /// array of canvas × vocabulary numbers.
    #[arg(long, requires = "canvas")]
    pub self_cond: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn logits(a: &LogitsArgs) -> Result<()> {
    let mut m = load(&a.model, RunnerConfig::default())?;
    let want = if a.all { Logits::All } else { Logits::Last };
    let rows = match &a.canvas {
        Some(c) => crate::diffusion::logits(&mut m, &a.tokens, c, a.self_cond.as_deref())?,
        None => m.runner.feed(SEQ, &a.tokens, want)?,
    };
    #[derive(Serialize)]
    struct J {
        logits: Vec<Vec<f32>>,
    }
    println!("{}", serde_json::to_string(&J { logits: rows })?);
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    /// The text file to score.
    #[arg(long, short)]
    pub file: std::path::PathBuf,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Save this run's next-token distributions (the 32 most likely tokens at each scored
    /// position) as the base for `--compare`, e.g. from the CPU with an f32 cache.
    #[arg(long, value_name = "FILE")]
    pub save_base: Option<std::path::PathBuf>,
    /// Compare this run with a `--save-base` file of the same text, chunks and vocabulary:
    /// the change in log-perplexity with its standard error, the KL divergence from the base
    /// (over the base's 32 most likely tokens and the rest as one: a lower bound of the full
    /// KL) and how often the most likely token is the same (another backend, KV cache type or
    /// weight format against the base).
    #[arg(long, value_name = "FILE", conflicts_with = "save_base")]
    pub compare: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Perplexity by llama.cpp's method: the text cut into chunks of `ctx` tokens, BOS at each
/// chunk's start when the model adds one, the second half of each chunk scored.
pub fn perplexity_of(
    runner: &mut Runner,
    tok: &Tokenizer,
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    progress: impl FnMut(usize, usize, f64),
) -> Result<(f64, usize)> {
    perplexity_with(
        runner,
        tok,
        tokens,
        ctx,
        max_chunks,
        progress,
        |_, _| Ok(()),
    )
}

/// The chunks `perplexity_of` scores for a text of `n` tokens.
pub fn perplexity_chunks(n: usize, ctx: usize, max_chunks: Option<usize>) -> usize {
    let c = n / ctx.max(1);
    max_chunks.map_or(c, |m| c.min(m))
}

/// [`perplexity_of`], handing `each` every scored position's log-probabilities and the token
/// that came next.
pub fn perplexity_with(
    runner: &mut Runner,
    tok: &Tokenizer,
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    mut progress: impl FnMut(usize, usize, f64),
    mut each: impl FnMut(&[f64], u32) -> Result<()>,
) -> Result<(f64, usize)> {
    if ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let n_chunks = perplexity_chunks(tokens.len(), ctx, max_chunks);
    if n_chunks == 0 {
        bail!(
            "the text has {} tokens; perplexity needs at least one chunk of {ctx}",
            tokens.len()
        );
    }
    let first = ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if tok.add_bos() {
            if let Some(b) = tok.bos() {
                chunk[0] = b;
            }
        }
        let seq = 1000 + c as SeqId;
        let rows = runner.feed(seq, &chunk, Logits::From(first))?;
        runner.release(seq)?;
        for (i, row) in rows.iter().enumerate().take(ctx - 1 - first) {
            let lp = log_softmax(row);
            let next = chunk[first + i + 1];
            let Some(l) = lp.get(next as usize) else {
                bail!(
                    "token {next} is outside the model's {} logits (a tokenizer larger than the output layer)",
                    lp.len()
                );
            };
            nll -= l;
            count += 1;
            each(&lp, next)?;
        }
        progress(c + 1, n_chunks, (nll / count as f64).exp());
    }
    Ok(((nll / count as f64).exp(), n_chunks))
}

/// The text as llama.cpp's `-f` reads it: one trailing newline dropped.
pub fn perplexity_text(s: &str) -> String {
    s.strip_suffix('\n').unwrap_or(s).to_string()
}

/// Tokens per perplexity chunk when `--ctx` is not given.
pub const PERPLEXITY_CTX: usize = 128;

pub fn perplexity(a: &PerplexityArgs) -> Result<()> {
    // `--ctx` (the model flag) is the chunk length here.
    let ctx = a.model.ctx.unwrap_or(PERPLEXITY_CTX);
    let text = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let text = perplexity_text(&String::from_utf8_lossy(&text));
    let cfg = RunnerConfig {
        max_batch_tokens: ctx.max(16),
        ..RunnerConfig::default()
    };
    let mut margs = a.model.clone();
    margs.ctx = Some(ctx);
    // A bad base file fails before the model loads.
    let base = a
        .compare
        .as_deref()
        .map(crate::kld::Base::read)
        .transpose()?;
    let mut m = load(&margs, cfg)?;
    let tokens = m.tokenizer.encode(&text, true)?;
    eprintln!(
        "kiln: {} tokens, {} chunks of {}",
        tokens.len(),
        tokens.len() / ctx,
        ctx
    );
    let chunks = perplexity_chunks(tokens.len(), ctx, a.chunks);
    let shape = |vocab: usize| crate::kld::Shape::of(&tokens, ctx, ctx / 2, chunks, vocab);
    if let (Some(b), Some(p)) = (&base, &a.compare) {
        // The vocabulary is checked against the first row of logits.
        let want = shape(b.shape.vocab as usize);
        if b.shape != want {
            bail!(
                "{} was saved from other tokens or chunks (ctx {}, {} chunks; this run: ctx {ctx}, {chunks} chunks{}): run both with the same --file, --ctx and --chunks and a model of the same vocabulary",
                p.display(),
                b.shape.ctx,
                b.shape.chunks,
                if b.shape.hash != want.hash && b.shape.chunks == want.chunks {
                    ", other tokens"
                } else {
                    ""
                }
            );
        }
    }
    let mut saver: Option<crate::kld::BaseWriter> = None;
    let mut stats = crate::kld::Stats::new(ctx - 1 - ctx / 2);
    let mut at = 0usize;
    let start = Instant::now();
    let (ppl, n) = perplexity_with(
        &mut m.runner,
        &m.tokenizer,
        &tokens,
        ctx,
        a.chunks,
        |i, n, p| {
            eprint!("\r[{i}/{n}] ppl {p:.4}   ");
        },
        |lp, next| {
            if (a.save_base.is_some() || base.is_some()) && lp.iter().any(|x| x.is_nan()) {
                bail!("position {at}: the logits hold NaN (the backend's output is broken)");
            }
            if let Some(path) = &a.save_base {
                saver
                    .get_or_insert_with(|| crate::kld::BaseWriter::new(path, shape(lp.len())))
                    .push(&crate::kld::record(lp, next));
            }
            if let Some(b) = &base {
                if lp.len() != b.shape.vocab as usize {
                    bail!(
                        "the base has a vocabulary of {}, this model {}",
                        b.shape.vocab,
                        lp.len()
                    );
                }
                let Some(r) = b.records.get(at) else {
                    bail!("the base has only {} positions", b.records.len());
                };
                if r.token != next {
                    bail!(
                        "position {at}: the base scored token {}, this run {next}",
                        r.token
                    );
                }
                stats.add(r, lp);
            }
            at += 1;
            Ok(())
        },
    )?;
    eprintln!();
    eprintln!("kiln: {n} chunks in {:.1} s", start.elapsed().as_secs_f64());
    println!("ppl = {ppl:.4}");
    if let Some(w) = saver {
        w.finish()?;
        if let Some(p) = &a.save_base {
            eprintln!("kiln: saved {at} positions to {}", p.display());
        }
    }
    if let Some(b) = &base {
        if at != b.records.len() {
            bail!(
                "the base has {} positions, this run scored {at}",
                b.records.len()
            );
        }
        println!("{}", stats.summary());
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value_t = 512)]
    pub n_predict: usize,
    /// Print each turn's prompt token ids (after the chat template) to stderr.
    #[arg(long)]
    pub verbose_prompt: bool,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
}

pub use kiln_core::chat::ChatPrompter;

pub fn chat(a: &ChatArgs) -> Result<()> {
    // Each turn is one request with the whole conversation; the prefix cache holds the turns
    // before, so only the new message and the reply are computed.
    let mut cfg = RunnerConfig {
        prefix_caching: true,
        ..RunnerConfig::default()
    };
    a.spec.prepare(&mut cfg)?;
    let m = load(&a.model, cfg)?;
    let tok = m.tokenizer;
    let src = tok
        .chat_template()
        .context("this model has no chat template (tokenizer.chat_template); use `kiln run`")?
        .to_string();
    let prompter = ChatPrompter::new(&tok, &src)?;
    let ctx = m.runner.config().ctx;
    let mut engine = a.spec.attach(crate::load::with_vision(
        Engine::new(m.runner, 1),
        &m.vision,
    ))?;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message::new("system", s.clone()));
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("kiln chat: type a message; an empty line or Ctrl-D ends.");
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        messages.push(Message::new(
            "user",
            line.trim_end_matches(['\n', '\r']).to_string(),
        ));
        let ids = prompter.ids(&tok, &messages)?;
        if a.verbose_prompt {
            eprintln!("prompt ids: {ids:?}");
        }
        if ids.len() + a.n_predict > ctx {
            bail!("the conversation has reached the context of {ctx} tokens");
        }
        let mut reply = String::new();
        let got = generate(
            &mut engine,
            &tok,
            (&ids, Vec::new()),
            a.n_predict,
            &a.sample,
            |p| {
                reply.push_str(p);
                out.write_all(p.as_bytes())?;
                out.flush()?;
                Ok(())
            },
        )?;
        tracing::debug!(
            "turn of {} prompt tokens, {} from the prefix cache; {}",
            ids.len(),
            got.cached,
            got.timings.line()
        );
        writeln!(out)?;
        messages.push(Message::new("assistant", reply));
    }
    Ok(())
}
