//! A loaded model and the chat loop the page runs: the model's own chat template, prefill in
//! chunks of the runner's batch, then one token at a time, each step's logits read back with
//! `download_async` (in a browser the GPU's answer arrives through the event loop). The same
//! code runs natively, where its tests compare it with kiln's engine.

use kiln_core::chat::{ChatPrompter, Message};
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
use kiln_core::runner::{Logits, Runner, RunnerConfig};
use kiln_core::sample::{Sampler, SamplingParams, StopMatcher};
use kiln_core::time::Instant;
use kiln_core::tokenizer::{StreamDecoder, Tokenizer};
use serde::Deserialize;
use serde_json::json;

/// The one sequence a page runs.
const SEQ: u64 = 1;
/// How a load that found an op the GPU lacks begins its message (the page's worker then tries
/// the CPU backend, when the backend was left to it).
pub const UNSUPPORTED: &str = "this browser's WebGPU adapter cannot run";
/// The context when the page does not ask for one: the model's, capped here (a browser's
/// memory is shared with everything else on the machine).
pub const DEFAULT_CTX: usize = 2048;

/// What a page may ask of a reply (JSON; every field optional).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenParams {
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub seed: Option<u64>,
    /// Strings that end the reply (not shown).
    pub stop: Vec<String>,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            max_tokens: 512,
            temperature: 0.7,
            top_p: 0.95,
            top_k: 40,
            seed: None,
            stop: Vec::new(),
        }
    }
}

/// How a reply went.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// `stop` (an end-of-generation token or a stop string), `length` (max_tokens or the
    /// context), or `cancelled` (the page said stop).
    pub finish: &'static str,
    /// Ops the device lacks that ran on the CPU reference so far (name, times), most first.
    pub cpu_ops: Vec<(String, u64)>,
}

impl Stats {
    pub fn to_json(&self) -> String {
        let tps = |n: usize, ms: f64| {
            if ms > 0.0 {
                n as f64 * 1000.0 / ms
            } else {
                0.0
            }
        };
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens.len(),
            "tokens": self.tokens,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "prompt_tps": tps(self.prompt_tokens, self.prefill_ms),
            // The first token comes from the prefill's logits: decode rate is over the rest.
            "decode_tps": tps(self.tokens.len().saturating_sub(1), self.decode_ms),
            "finish_reason": self.finish,
            "cpu_ops": self.cpu_ops.iter().map(|(op, n)| json!({"op": op, "count": n})).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

/// A model ready to chat.
pub struct Session {
    runner: Runner,
    tok: Tokenizer,
    template: Option<ChatPrompter>,
    info: serde_json::Value,
}

impl Session {
    /// Builds the model of `file` on `ex` with a context of `ctx` tokens (default: the
    /// model's, at most [`DEFAULT_CTX`]).
    pub fn load(file: &GgufFile, ex: Executor, ctx: Option<usize>) -> Result<Session, String> {
        let started = Instant::now();
        let tok = Tokenizer::from_gguf(file).map_err(|e| e.to_string())?;
        let template = match tok.chat_template() {
            Some(src) => Some(
                ChatPrompter::new(&tok, src)
                    .map_err(|e| format!("the model's chat template: {e}"))?,
            ),
            None => None,
        };
        let device = ex.backend().capabilities().device.clone();
        let model = build_from_gguf(file, &ex).map_err(|e| e.to_string())?;
        let info = model.info();
        let ctx = ctx
            .unwrap_or(info.context_length.min(DEFAULT_CTX))
            .clamp(16, info.context_length.max(16));
        let summary = json!({
            "name": file.path(),
            "architecture": info.architecture,
            "parameters": info.n_params,
            "vocab": info.vocab,
            "context": ctx,
            "device": device,
            "chat_template": template.is_some(),
            "file_bytes": file.file_size(),
        });
        let cfg = RunnerConfig {
            ctx,
            max_seqs: 1,
            ..RunnerConfig::default()
        };
        let runner = Runner::new(ex, model, cfg).map_err(|e| e.to_string())?;
        let mut session = Session {
            runner,
            tok,
            template,
            info: summary,
        };
        session.info["load_ms"] = json!(started.elapsed().as_secs_f64() * 1000.0);
        Ok(session)
    }

    /// A two-token prefill and one decode step, then the sequence is let go: on an executor
    /// that may not fall back to the CPU (a browser's, where reading a GPU buffer back in the
    /// middle of a step is impossible), this finds an op the device lacks at load time.
    pub async fn warm_up(&mut self) -> Result<(), String> {
        let vocab = self.runner.model().info().vocab.max(1) as u32;
        // Two tokens take the prefill's kernels (more than one row), one the decode's.
        let prompt: Vec<u32> = (0..2u32).map(|i| (i * 7 + 1) % vocab).collect();
        let lacks = |e: kiln_core::Error| match e {
            kiln_core::Error::StrictFallback { op, .. } => {
                format!("{UNSUPPORTED} {op}; the CPU backend (Options) can run this model")
            }
            other => other.to_string(),
        };
        let r = async {
            self.runner
                .step_async(&[(SEQ, &prompt, Logits::Last)])
                .await
                .map_err(lacks)?;
            self.runner
                .step_async(&[(SEQ, &prompt[..1], Logits::Last)])
                .await
                .map_err(lacks)?;
            Ok(())
        }
        .await;
        self.runner.release(SEQ).map_err(|e| e.to_string())?;
        r
    }

    /// Architecture, parameters, context, device, load time (JSON).
    pub fn info(&self) -> &serde_json::Value {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The prompt's ids for a reply to `messages`: through the model's chat template, or, for
    /// a model without one, the last message's text as a plain prompt.
    pub fn prompt(&self, messages: &[Message]) -> Result<Vec<u32>, String> {
        match &self.template {
            Some(t) => t.ids(&self.tok, messages).map_err(|e| e.to_string()),
            None => {
                let last = messages.last().ok_or("no messages")?;
                self.tok
                    .encode(&last.content, true)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Generates the reply to `messages`, calling `emit` with each piece of visible text; the
    /// reply ends when `emit` returns false (cancelled), at an end-of-generation token or stop
    /// string, or after `max_tokens` (or at the context's end). `pause` is awaited after each
    /// token: in a browser, where a CPU step never waits on the event loop, it lets the page's
    /// messages (a stop) in.
    pub async fn chat<F: std::future::Future<Output = ()>>(
        &mut self,
        messages: &[Message],
        p: &GenParams,
        mut emit: impl FnMut(&str) -> bool,
        mut pause: impl FnMut() -> F,
    ) -> Result<Stats, String> {
        let prompt = self.prompt(messages)?;
        let ctx = self.runner.config().ctx;
        if prompt.is_empty() {
            return Err("the prompt is empty".into());
        }
        if prompt.len() >= ctx {
            return Err(format!(
                "the conversation has {} tokens, which fills the context of {ctx}: start a new chat or load the model with a longer context",
                prompt.len()
            ));
        }
        let params = SamplingParams {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            seed: p.seed,
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params).map_err(|e| e.to_string())?;
        let max = p.max_tokens.min(ctx - prompt.len());
        // A reply starts from an empty cache (the previous reply's sequence is let go).
        if self.runner.has_sequence(SEQ) {
            self.runner.release(SEQ).map_err(|e| e.to_string())?;
        }
        let started = Instant::now();
        let chunk = self.runner.config().max_batch_tokens.max(1);
        let mut logits = Vec::new();
        let mut at = 0;
        while at < prompt.len() {
            // Between chunks of a long prompt the page may say stop.
            if at > 0 {
                pause().await;
                if !emit("") {
                    return Ok(Stats {
                        prompt_tokens: prompt.len(),
                        tokens: Vec::new(),
                        prefill_ms: started.elapsed().as_secs_f64() * 1000.0,
                        decode_ms: 0.0,
                        finish: "cancelled",
                        cpu_ops: Vec::new(),
                    });
                }
            }
            let end = (at + chunk).min(prompt.len());
            let want = if end == prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            let rows = self
                .runner
                .step_async(&[(SEQ, &prompt[at..end], want)])
                .await
                .map_err(|e| e.to_string())?;
            if end == prompt.len() {
                logits = last_row(rows)?;
            }
            at = end;
        }
        let prefill_ms = started.elapsed().as_secs_f64() * 1000.0;
        let decoding = Instant::now();
        let mut stats = Stats {
            prompt_tokens: prompt.len(),
            tokens: Vec::new(),
            prefill_ms,
            decode_ms: 0.0,
            finish: "length",
            cpu_ops: Vec::new(),
        };
        let mut history = prompt.clone();
        let mut text = StreamDecoder::new();
        let mut stops = StopMatcher::new(&p.stop);
        while stats.tokens.len() < max {
            let t = sampler.sample(&mut logits, &history);
            if self.tok.is_eog(t) {
                stats.finish = "stop";
                break;
            }
            stats.tokens.push(t);
            history.push(t);
            let piece = stops.push(&text.push(&self.tok, t));
            let mut go_on = emit(&piece);
            if go_on && !stops.stopped() {
                pause().await;
                go_on = emit("");
            }
            if stops.stopped() {
                stats.finish = "stop";
                break;
            }
            if !go_on {
                stats.finish = "cancelled";
                break;
            }
            if stats.tokens.len() == max {
                break;
            }
            let rows = self
                .runner
                .step_async(&[(SEQ, &[t], Logits::Last)])
                .await
                .map_err(|e| e.to_string())?;
            logits = last_row(rows)?;
        }
        if stats.finish != "cancelled" {
            let tail = text.finish();
            emit(&stops.push(&tail));
            emit(&stops.finish());
        }
        stats.decode_ms = decoding.elapsed().as_secs_f64() * 1000.0;
        stats.cpu_ops = self
            .runner
            .executor()
            .fallbacks()
            .into_iter()
            .map(|f| (f.op.to_string(), f.count))
            .collect();
        Ok(stats)
    }
}

fn last_row(rows: Vec<Vec<Vec<f32>>>) -> Result<Vec<f32>, String> {
    rows.into_iter()
        .next()
        .and_then(|r| r.into_iter().last())
        .ok_or_else(|| "the step returned no logits".to_string())
}
