//! `kiln serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.
//!
//! Endpoints: POST /v1/completions and /v1/chat/completions (streamed as server-sent events or
//! not), GET /v1/models, GET /health, GET /metrics (Prometheus text). Requests are parsed by hand from the body bytes so every
//! malformed request gets an OpenAI-style error JSON with a 4xx status. A client that goes away
//! drops its event channel, and the engine cancels the request at its next token.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_core::chat::{ChatTemplate, Message};
use kiln_core::engine::batching::{spawn, Engine, EngineHandle, Event, Finish, GenRequest};
use kiln_core::engine::RunnerConfig;
use kiln_core::sample::{SamplingParams, StopMatcher};
use kiln_core::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::{json, Value};

use crate::load::{load, Loaded, ModelArgs};

/// Largest request body, in bytes.
pub const MAX_BODY: usize = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on every /v1 request.
    #[arg(long, env = "KILN_API_KEY")]
    pub api_key: Option<String>,
    /// Requests decoded together (resident in the KV cache) at once.
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// KV cache blocks (16 tokens each); default enough for --max-batch full contexts.
    #[arg(long)]
    pub kv_blocks: Option<usize>,
}

/// What the handlers share.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub model: String,
    pub ctx: usize,
    pub api_key: Option<String>,
}

pub fn run(a: &ServeArgs) -> Result<()> {
    let cfg = RunnerConfig {
        max_seqs: a.max_batch.max(1),
        kv_blocks: a.kv_blocks,
        // Used where the model allows it (one full-attention KV group).
        prefix_caching: true,
        ..RunnerConfig::default()
    };
    let state = state(load(&a.model, cfg)?, a.max_batch, a.api_key.clone())?;
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("bad address {}:{}", a.host, a.port))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        eprintln!("kiln: serving {} on http://{addr}/v1", state.model);
        axum::serve(listener, router(state)).await?;
        Ok(())
    })
}

/// The server's state over a loaded model: the engine thread, the tokenizer and the chat
/// template.
pub fn state(m: Loaded, max_batch: usize, api_key: Option<String>) -> Result<Arc<AppState>> {
    let ctx = m.runner.config().ctx;
    let model = m
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "kiln".into());
    let template = match m.tokenizer.chat_template() {
        Some(src) => {
            let piece = |id: Option<u32>| id.map(|i| m.tokenizer.decode(&[i])).unwrap_or_default();
            Some(ChatTemplate::new(
                src,
                &piece(m.tokenizer.bos()),
                &piece(m.tokenizer.eos()),
            )?)
        }
        None => None,
    };
    Ok(Arc::new(AppState {
        engine: spawn(Engine::new(m.runner, max_batch)),
        tokenizer: m.tokenizer,
        template,
        model,
        ctx,
        api_key,
    }))
}

/// The HTTP routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// An OpenAI-style error response.
struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn bad(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }});
        (self.status, Json(body)).into_response()
    }
}

/// Constant-time comparison of the presented key with the configured one.
fn key_matches(given: &[u8], want: &[u8]) -> bool {
    let mut diff = (given.len() ^ want.len()) as u8 | u8::from(given.len() != want.len());
    for (i, w) in want.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ w;
    }
    diff == 0
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if key_matches(given.as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (Authorization: Bearer <key>)".into(),
            param: None,
            code: Some("invalid_api_key"),
        })
    }
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [
        {"id": state.model, "object": "model", "created": now(), "owned_by": "kiln"}
    ]}))
    .into_response()
}

/// Prometheus text format.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let s = state.engine.snapshot();
    let mut out = String::new();
    let rows: [(&str, &str, &str, usize); 10] = [
        (
            "kiln_requests_waiting",
            "gauge",
            "Requests queued.",
            s.waiting,
        ),
        (
            "kiln_requests_running",
            "gauge",
            "Requests resident in the KV cache.",
            s.running,
        ),
        (
            "kiln_kv_blocks_free",
            "gauge",
            "Free KV cache blocks.",
            s.kv_free,
        ),
        (
            "kiln_kv_blocks_total",
            "gauge",
            "KV cache blocks in all.",
            s.kv_total,
        ),
        (
            "kiln_engine_steps_total",
            "counter",
            "Forward passes.",
            s.stats.steps as usize,
        ),
        (
            "kiln_tokens_computed_total",
            "counter",
            "Tokens run through the model.",
            s.stats.tokens_computed as usize,
        ),
        (
            "kiln_generated_tokens_total",
            "counter",
            "Tokens generated.",
            s.stats.generated as usize,
        ),
        (
            "kiln_preemptions_total",
            "counter",
            "Requests preempted for KV space.",
            s.stats.preemptions as usize,
        ),
        (
            "kiln_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens whose K/V came from the prefix cache.",
            s.stats.prefix_hit_tokens as usize,
        ),
        (
            "kiln_requests_cancelled_total",
            "counter",
            "Requests whose client went away.",
            s.stats.cancelled as usize,
        ),
    ];
    for (name, kind, help, v) in rows {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
        ));
    }
    out.push_str("# HELP kiln_cpu_fallbacks_total Ops run on the CPU reference because the backend lacks them.\n# TYPE kiln_cpu_fallbacks_total counter\n");
    for (backend, op, n) in &s.fallbacks {
        out.push_str(&format!(
            "kiln_cpu_fallbacks_total{{backend=\"{backend}\",op=\"{op}\"}} {n}\n"
        ));
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A request's generation settings, validated.
struct GenSpec {
    prompt: Vec<u32>,
    params: SamplingParams,
    max_tokens: usize,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
}

fn body_json(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(ApiError::bad(format!("invalid JSON: {e}"), None)),
    }
}

fn number(
    b: &serde_json::Map<String, Value>,
    key: &'static str,
    lo: f64,
    hi: f64,
) -> Result<Option<f64>, ApiError> {
    match b.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let v = n.as_f64().unwrap_or(f64::NAN);
            if v >= lo && v <= hi {
                Ok(Some(v))
            } else {
                Err(ApiError::bad(
                    format!("{key} must be between {lo} and {hi}, got {v}"),
                    Some(key),
                ))
            }
        }
        Some(_) => Err(ApiError::bad(format!("{key} must be a number"), Some(key))),
    }
}

fn integer(
    b: &serde_json::Map<String, Value>,
    key: &'static str,
    lo: u64,
    hi: u64,
) -> Result<Option<u64>, ApiError> {
    match b.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v >= lo && v <= hi => Ok(Some(v)),
            _ => Err(ApiError::bad(
                format!("{key} must be an integer from {lo} to {hi}"),
                Some(key),
            )),
        },
        Some(_) => Err(ApiError::bad(
            format!("{key} must be an integer"),
            Some(key),
        )),
    }
}

/// The settings every endpoint shares: sampling, limits, stop strings, streaming.
fn common(
    state: &AppState,
    b: &serde_json::Map<String, Value>,
    prompt: Vec<u32>,
    default_max: usize,
    max_keys: &[&'static str],
) -> Result<GenSpec, ApiError> {
    if let Some(m) = b.get("model") {
        let name = m
            .as_str()
            .ok_or_else(|| ApiError::bad("model must be a string", Some("model")))?;
        if !name.is_empty() && name != state.model {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model {name:?} does not exist; this server has {:?}",
                    state.model
                ),
                param: Some("model"),
                code: Some("model_not_found"),
            });
        }
    }
    if integer(b, "n", 1, 1)?.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("only n = 1 is supported", Some("n")));
    }
    for key in ["logprobs", "top_logprobs"] {
        if b.get(key)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        {
            return Err(ApiError::bad(
                format!("{key} is not supported yet"),
                Some(if key == "logprobs" {
                    "logprobs"
                } else {
                    "top_logprobs"
                }),
            ));
        }
    }
    if prompt.len() >= state.ctx {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "the prompt has {} tokens; the context holds {}",
                prompt.len(),
                state.ctx
            ),
            param: Some("messages"),
            code: Some("context_length_exceeded"),
        });
    }
    let mut max_tokens = default_max;
    for key in max_keys {
        if let Some(v) = integer(b, key, 1, u32::MAX as u64)? {
            max_tokens = v as usize;
        }
    }
    let mut params = SamplingParams::default();
    if let Some(t) = number(b, "temperature", 0.0, 2.0)? {
        params.temperature = t as f32;
    }
    if let Some(p) = number(b, "top_p", 0.0, 1.0)? {
        params.top_p = p as f32;
    }
    if let Some(k) = integer(b, "top_k", 0, u32::MAX as u64)? {
        params.top_k = k as usize;
    }
    if let Some(p) = number(b, "min_p", 0.0, 1.0)? {
        params.min_p = p as f32;
    }
    if let Some(p) = number(b, "presence_penalty", -2.0, 2.0)? {
        params.presence_penalty = p as f32;
    }
    if let Some(p) = number(b, "frequency_penalty", -2.0, 2.0)? {
        params.frequency_penalty = p as f32;
    }
    if let Some(s) = integer(b, "seed", 0, u64::MAX)? {
        params.seed = Some(s);
    }
    params
        .validate()
        .map_err(|e| ApiError::bad(e.to_string(), None))?;
    let stop = match b.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(v)) if v.len() <= 4 => v
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad("stop must hold strings", Some("stop")))?,
        Some(_) => {
            return Err(ApiError::bad(
                "stop must be a string or up to 4 strings",
                Some("stop"),
            ))
        }
    };
    let stream = match b.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(s)) => *s,
        Some(_) => return Err(ApiError::bad("stream must be a boolean", Some("stream"))),
    };
    let include_usage = b
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(GenSpec {
        prompt,
        params,
        max_tokens: max_tokens.min(state.ctx.saturating_sub(1).max(1)),
        stop,
        stream,
        include_usage,
    })
}

fn completion_prompt(
    state: &AppState,
    b: &serde_json::Map<String, Value>,
) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::bad(
            "prompt must be a string or a list of token ids",
            Some("prompt"),
        )
    };
    let ids = match b.get("prompt") {
        Some(Value::String(s)) => state
            .tokenizer
            .encode(s, true)
            .map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?,
        Some(Value::Array(v)) if v.len() == 1 && v[0].is_string() => state
            .tokenizer
            .encode(v[0].as_str().unwrap_or(""), true)
            .map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?,
        Some(Value::Array(v)) => v
            .iter()
            .map(|x| x.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    let vocab = state.tokenizer.vocab_size();
    if ids.is_empty() {
        return Err(ApiError::bad("the prompt is empty", Some("prompt")));
    }
    if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            format!("token id {t} is outside the vocabulary of {vocab}"),
            Some("prompt"),
        ));
    }
    Ok(ids)
}

fn chat_prompt(state: &AppState, b: &serde_json::Map<String, Value>) -> Result<Vec<u32>, ApiError> {
    let tpl = state.template.as_ref().ok_or_else(|| {
        ApiError::bad("this model has no chat template; use /v1/completions", None)
    })?;
    let list = b
        .get("messages")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad("messages must be a non-empty list", Some("messages")))?;
    let mut messages = Vec::with_capacity(list.len());
    for m in list {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad(
                format!("unknown message role {role:?}"),
                Some("messages"),
            ));
        }
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            // Content parts: the text ones, concatenated.
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            Some(_) => {
                return Err(ApiError::bad(
                    "message content must be a string or a list of parts",
                    Some("messages"),
                ))
            }
        };
        let role = if role == "developer" { "system" } else { role };
        messages.push(Message::new(role, content));
    }
    let text = tpl
        .render(&messages, true)
        .map_err(|e| ApiError::bad(format!("chat template: {e}"), Some("messages")))?;
    // The template writes BOS itself where the model wants one.
    state
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))
}

/// The body, or an OpenAI-style error (413 when it is over the size limit).
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError {
        status: e.status(),
        message: format!("cannot read the request body: {}", e.body_text()),
        param: None,
        code: None,
    })
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        authorize(&state, &headers)?;
        let b = body_json(&body_bytes(body)?)?;
        let prompt = completion_prompt(&state, &b)?;
        common(&state, &b, prompt, 16, &["max_tokens"])
    })();
    match r {
        Ok(spec) => respond(state, spec, Kind::Text).await,
        Err(e) => e.into_response(),
    }
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        authorize(&state, &headers)?;
        let b = body_json(&body_bytes(body)?)?;
        let prompt = chat_prompt(&state, &b)?;
        let room = state.ctx.saturating_sub(prompt.len() + 1).max(1);
        common(
            &state,
            &b,
            prompt,
            room,
            &["max_tokens", "max_completion_tokens"],
        )
    })();
    match r {
        Ok(spec) => respond(state, spec, Kind::Chat).await,
        Err(e) => e.into_response(),
    }
}

#[derive(Copy, Clone, PartialEq)]
enum Kind {
    Text,
    Chat,
}

/// Text pieces of a generation, ready to send.
enum Piece {
    Text(String),
    End {
        finish: &'static str,
        completion: usize,
    },
    Failed(String),
}

/// Starts the request on the engine; pieces of text arrive on the returned channel. The
/// engine's blocking event channel is drained on a blocking thread; when the returned
/// receiver is dropped (the client left, or a stop string matched) that thread ends and drops
/// the engine's receiver, which cancels the request.
fn start(state: &Arc<AppState>, spec: &GenSpec) -> tokio::sync::mpsc::Receiver<Piece> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Piece>(64);
    let events = state.engine.submit(GenRequest {
        prompt: spec.prompt.clone(),
        params: spec.params.clone(),
        max_tokens: spec.max_tokens,
        stop_ids: state.tokenizer.eog_ids().to_vec(),
    });
    let st = state.clone();
    let stops = spec.stop.clone();
    tokio::task::spawn_blocking(move || {
        let mut dec = StreamDecoder::new();
        let mut stop = StopMatcher::new(&stops);
        let mut generated = 0;
        while let Ok(ev) = events.recv() {
            let piece = match ev {
                Event::Token(t) => {
                    generated += 1;
                    let text = stop.push(&dec.push(&st.tokenizer, t));
                    if stop.stopped() {
                        let _ = tx.blocking_send(Piece::Text(text));
                        let _ = tx.blocking_send(Piece::End {
                            finish: "stop",
                            completion: generated,
                        });
                        return;
                    }
                    Piece::Text(text)
                }
                Event::Done {
                    finish, generated, ..
                } => {
                    let mut tail = stop.push(&dec.finish());
                    tail.push_str(&stop.finish());
                    let _ = tx.blocking_send(Piece::Text(tail));
                    let finish = if finish == Finish::Stop || stop.stopped() {
                        "stop"
                    } else {
                        "length"
                    };
                    let _ = tx.blocking_send(Piece::End {
                        finish,
                        completion: generated,
                    });
                    return;
                }
                Event::Error(e) => Piece::Failed(e),
            };
            if tx.blocking_send(piece).is_err() {
                return;
            }
        }
    });
    rx
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
}

async fn respond(state: Arc<AppState>, spec: GenSpec, kind: Kind) -> Response {
    let prompt_len = spec.prompt.len();
    let mut rx = start(&state, &spec);
    let id = format!(
        "{}-{:x}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        now() ^ (prompt_len as u64) << 32 ^ rand_bits()
    );
    if !spec.stream {
        let mut text = String::new();
        while let Some(p) = rx.recv().await {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::End { finish, completion } => {
                    let choice = match kind {
                        Kind::Text => json!({"index": 0, "text": text, "logprobs": null,
                                             "finish_reason": finish}),
                        Kind::Chat => json!({"index": 0, "message":
                                             {"role": "assistant", "content": text},
                                             "logprobs": null, "finish_reason": finish}),
                    };
                    let object = if kind == Kind::Chat {
                        "chat.completion"
                    } else {
                        "text_completion"
                    };
                    return Json(json!({"id": id, "object": object, "created": now(),
                        "model": state.model, "choices": [choice],
                        "usage": usage(prompt_len, completion)}))
                    .into_response();
                }
                Piece::Failed(e) => {
                    return ApiError {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        message: e,
                        param: None,
                        code: None,
                    }
                    .into_response()
                }
            }
        }
        return ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "the engine ended the request without a result".into(),
            param: None,
            code: None,
        }
        .into_response();
    }
    let model = state.model.clone();
    let created = now();
    let include_usage = spec.include_usage;
    let chunk = move |delta: Value, finish: Value| -> Value {
        match kind {
            Kind::Text => json!({"id": id, "object": "text_completion", "created": created,
                "model": model, "choices": [{"index": 0, "text": delta, "logprobs": null,
                "finish_reason": finish}]}),
            Kind::Chat => json!({"id": id, "object": "chat.completion.chunk",
                "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null,
                "finish_reason": finish}]}),
        }
    };
    let first = (kind == Kind::Chat)
        .then(|| chunk(json!({"role": "assistant", "content": ""}), Value::Null));
    let stream =
        futures_util::stream::unfold((rx, first, false), move |(mut rx, mut first, done)| {
            let chunk = chunk.clone();
            async move {
                if let Some(f) = first.take() {
                    return Some((vec![f.to_string()], (rx, None, false)));
                }
                if done {
                    return None;
                }
                let out = match rx.recv().await {
                    Some(Piece::Text(t)) if t.is_empty() => Vec::new(),
                    Some(Piece::Text(t)) => {
                        let delta = match kind {
                            Kind::Text => Value::String(t),
                            Kind::Chat => json!({"content": t}),
                        };
                        vec![chunk(delta, Value::Null).to_string()]
                    }
                    Some(Piece::End { finish, completion }) => {
                        let empty = match kind {
                            Kind::Text => Value::String(String::new()),
                            Kind::Chat => json!({}),
                        };
                        let mut v = vec![chunk(empty, Value::String(finish.into())).to_string()];
                        if include_usage {
                            let mut u = chunk(Value::Null, Value::Null);
                            u["choices"] = json!([]);
                            u["usage"] = usage(prompt_len, completion);
                            v.push(u.to_string());
                        }
                        v.push("[DONE]".into());
                        return Some((v, (rx, None, true)));
                    }
                    Some(Piece::Failed(e)) => {
                        let v = vec![
                            json!({"error": {"message": e, "type": "server_error"}}).to_string(),
                            "[DONE]".into(),
                        ];
                        return Some((v, (rx, None, true)));
                    }
                    None => return None,
                };
                Some((out, (rx, None, false)))
            }
        });
    let events = futures_util::StreamExt::flat_map(stream, |v| {
        futures_util::stream::iter(
            v.into_iter()
                .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d))),
        )
    });
    Sse::new(events).into_response()
}

/// A few bits that differ between requests, for response ids.
fn rand_bits() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::key_matches;

    #[test]
    fn api_keys_compare_exactly() {
        assert!(key_matches(b"secret", b"secret"));
        assert!(!key_matches(b"secreT", b"secret"));
        assert!(!key_matches(b"secret1", b"secret"));
        assert!(!key_matches(b"secre", b"secret"));
        assert!(!key_matches(b"", b"secret"));
    }
}
