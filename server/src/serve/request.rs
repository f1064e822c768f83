//! Request bodies, parsed by hand from JSON so every mistake gets an OpenAI-style 4xx error
//! naming the parameter.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use kiln_core::chat::calls::{tool_call_grammar, Calls};
use kiln_core::chat::parse::Syntax;
use kiln_core::grammar::{Constraint, GrammarSpec};
use kiln_core::sample::{SamplingParams, MAX_TOP_LOGPROBS};
use serde_json::{json, Map, Value};
use std::sync::Arc;

use super::AppState;

/// Most choices one request may ask for (`n`).
pub const MAX_N: u64 = 16;

/// An OpenAI-style error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// An error with `status` and no parameter or code.
    pub fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn bad(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
            code: None,
        }
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            param: None,
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }});
        let retry = matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        let mut res = (self.status, Json(body)).into_response();
        if retry {
            res.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        res
    }
}

/// Which endpoint a request came to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Text,
    Chat,
}

/// A request's generation settings, validated.
pub struct GenSpec {
    pub kind: Kind,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate.
    pub n: usize,
    /// Log-probabilities: `Some(k)` gives each token's and its `k` best alternatives.
    pub logprobs: Option<usize>,
    /// How chat output is split into content, reasoning and tool calls.
    pub syntax: Syntax,
    /// The prompt left the model inside `<think>`.
    pub in_reasoning: bool,
    /// Keep generating past the model's end-of-generation tokens (`ignore_eos`, the vLLM and
    /// llama.cpp extension benchmark clients send).
    pub ignore_eos: bool,
    /// `return_token_ids` (vLLM's extension): the response carries `prompt_token_ids`, the
    /// prompt as the model saw it (after the chat template).
    pub return_token_ids: bool,
    /// Completions with `echo`: the prompt's text, sent before the generated text.
    pub echo: Option<String>,
    /// `stream_drafts` (block-diffusion models, streamed): each denoising step's draft.
    pub drafts: bool,
    /// `autoregressive` (kiln's extension): a block-diffusion model generates this request
    /// token by token from its encoder's logits instead of denoising canvases.
    pub autoregressive: bool,
    /// What the output must follow: `response_format`, `grammar`, or a forced tool call.
    pub grammar: Option<GrammarSpec>,
    /// `grammar` compiled ([`constrain`]).
    pub constraint: Option<Constraint>,
    /// A chat request's tools (their schemas type the parsed calls' arguments).
    pub tools: Vec<Value>,
    /// The prompt's images, placed at their soft tokens.
    pub images: Vec<kiln_core::engine::PromptImage>,
}

pub type Body = Map<String, Value>;

pub fn body_json(body: &[u8]) -> Result<Body, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(ApiError::bad(format!("invalid JSON: {e}"), None)),
    }
}

fn number(b: &Body, key: &'static str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
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

fn integer(b: &Body, key: &'static str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
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

pub fn boolean(b: &Body, key: &'static str) -> Result<Option<bool>, ApiError> {
    match b.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(v)) => Ok(Some(*v)),
        Some(_) => Err(ApiError::bad(format!("{key} must be a boolean"), Some(key))),
    }
}

/// The `model` field names this server's model (or is empty or absent).
pub fn check_model(state: &AppState, b: &Body) -> Result<(), ApiError> {
    let Some(m) = b.get("model") else {
        return Ok(());
    };
    let name = m
        .as_str()
        .ok_or_else(|| ApiError::bad("model must be a string", Some("model")))?;
    if name.is_empty() || name == state.model {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "the model {name:?} does not exist; this server has {:?}",
            state.model
        ),
        param: Some("model"),
        code: Some("model_not_found"),
    })
}

/// Log-probability settings: completions take `logprobs: k` (0 to 5); chat takes
/// `logprobs: true` with `top_logprobs: k` (0 to 20).
fn logprobs(kind: Kind, b: &Body) -> Result<Option<usize>, ApiError> {
    match kind {
        Kind::Text => Ok(integer(b, "logprobs", 0, 5)?.map(|k| k as usize)),
        Kind::Chat => {
            let top = integer(b, "top_logprobs", 0, MAX_TOP_LOGPROBS as u64)?;
            match (boolean(b, "logprobs")?, top) {
                (Some(true), top) => Ok(Some(top.unwrap_or(0) as usize)),
                (_, Some(_)) => Err(ApiError::bad(
                    "top_logprobs needs logprobs: true",
                    Some("top_logprobs"),
                )),
                _ => Ok(None),
            }
        }
    }
}

/// The settings every endpoint shares: sampling, limits, stop strings, streaming, choices.
pub fn common(
    state: &AppState,
    kind: Kind,
    b: &Body,
    prompt: Vec<u32>,
    default_max: usize,
) -> Result<GenSpec, ApiError> {
    check_model(state, b)?;
    if prompt.len() >= state.ctx {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "the prompt has {} tokens; the context holds {}",
                prompt.len(),
                state.ctx
            ),
            param: Some(if kind == Kind::Chat {
                "messages"
            } else {
                "prompt"
            }),
            code: Some("context_length_exceeded"),
        });
    }
    let max_keys: &[&'static str] = match kind {
        Kind::Text => &["max_tokens"],
        Kind::Chat => &["max_tokens", "max_completion_tokens"],
    };
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
    let stream = boolean(b, "stream")?.unwrap_or(false);
    let include_usage = match b.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(v)) => *v,
            Some(_) => {
                return Err(ApiError::bad(
                    "stream_options.include_usage must be a boolean",
                    Some("stream_options"),
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::bad(
                "stream_options must be an object",
                Some("stream_options"),
            ))
        }
    };
    let drafts = boolean(b, "stream_drafts")?.unwrap_or(false);
    if drafts && !stream {
        return Err(ApiError::bad(
            "stream_drafts needs \"stream\": true",
            Some("stream_drafts"),
        ));
    }
    let autoregressive = boolean(b, "autoregressive")?.unwrap_or(false);
    if drafts && (!state.diffusion || autoregressive) {
        return Err(ApiError::bad(
            "stream_drafts needs a block-diffusion model denoising the request; this one \
             generates it token by token",
            Some("stream_drafts"),
        ));
    }
    let n = integer(b, "n", 1, MAX_N)?.unwrap_or(1) as usize;
    params.logit_bias = logit_bias(state, b)?;
    refuse_unsupported(kind, b, n)?;
    Ok(GenSpec {
        kind,
        prompt,
        params,
        max_tokens: max_tokens.min(state.ctx.saturating_sub(1).max(1)),
        stop,
        stream,
        include_usage,
        n,
        logprobs: logprobs(kind, b)?,
        syntax: Syntax::default(),
        in_reasoning: false,
        ignore_eos: boolean(b, "ignore_eos")?.unwrap_or(false),
        return_token_ids: boolean(b, "return_token_ids")?.unwrap_or(false),
        echo: None,
        drafts,
        autoregressive,
        grammar: grammar(b)?,
        constraint: None,
        tools: Vec::new(),
        images: Vec::new(),
    })
}

/// `response_format` (`text`, `json_object`, `json_schema` with its `schema`) and `grammar`
/// (a grammar in llguidance's Lark dialect, which embeds JSON schemas as `%json {…}` and
/// regular expressions as `/…/`); at most one of them.
fn grammar(b: &Body) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: &str| ApiError::bad(m, Some("response_format"));
    let format = match b.get("response_format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(f)) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            // llama-server's extension: a schema beside json_object.
            Some("json_object") => Some(match f.get("schema") {
                Some(s @ Value::Object(_)) => GrammarSpec::JsonSchema(s.clone()),
                _ => GrammarSpec::json_object(),
            }),
            Some("json_schema") => {
                let schema = f
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .or_else(|| f.get("schema"))
                    .ok_or_else(|| {
                        bad("response_format json_schema needs json_schema.schema (an object)")
                    })?;
                match schema {
                    Value::Object(_) | Value::Bool(true) => {
                        Some(GrammarSpec::JsonSchema(schema.clone()))
                    }
                    _ => return Err(bad("json_schema.schema must be a JSON schema object")),
                }
            }
            _ => {
                return Err(bad(
                    "response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        },
        Some(_) => return Err(bad("response_format must be an object")),
    };
    let lark = match b.get("grammar") {
        None | Some(Value::Null) => None,
        Some(Value::String(g)) if !g.trim().is_empty() => Some(GrammarSpec::Lark(g.clone())),
        Some(_) => {
            return Err(ApiError::bad(
                "grammar must be a non-empty string (a Lark grammar)",
                Some("grammar"),
            ))
        }
    };
    match (format, lark) {
        (Some(_), Some(_)) => Err(ApiError::bad(
            "give response_format or grammar, not both",
            Some("grammar"),
        )),
        (f, g) => Ok(f.or(g)),
    }
}

/// Compiles the request's grammar for this model (a grammar that does not compile is a 400
/// saying why).
pub fn constrain(state: &AppState, spec: &mut GenSpec) -> Result<(), ApiError> {
    let Some(g) = &spec.grammar else {
        return Ok(());
    };
    if state.diffusion && !spec.autoregressive {
        return Err(ApiError::bad(
            "grammars are not available with a block-diffusion model (unless the request \
             asks for \"autoregressive\": true)",
            Some("response_format"),
        ));
    }
    let grammars = state.grammars().map_err(ApiError::internal)?;
    let param = match g {
        GrammarSpec::Lark(_) => "grammar",
        _ => "response_format",
    };
    let c = grammars
        .compile(g)
        .map_err(|e| ApiError::bad(e.to_string(), Some(param)))?;
    spec.constraint = Some(c);
    Ok(())
}

/// `logit_bias`: `{"token id": bias}` with biases in [−100, 100] and ids in the vocabulary.
fn logit_bias(state: &AppState, b: &Body) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad(m, Some("logit_bias"));
    let map = match b.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(bad("logit_bias must map token ids to numbers".into())),
    };
    let vocab = state.tokenizer.vocab_size();
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id = k
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&t| (t as usize) < vocab)
            .ok_or_else(|| {
                bad(format!(
                    "{k:?} is not a token id of the vocabulary of {vocab}"
                ))
            })?;
        let bias = v
            .as_f64()
            .filter(|x| (-100.0..=100.0).contains(x))
            .ok_or_else(|| {
                bad(format!(
                    "the bias of token {k} must be a number in [-100, 100]"
                ))
            })?;
        out.push((id, bias as f32));
    }
    Ok(out)
}

/// Fields kiln does not implement are refused by name rather than silently ignored.
fn refuse_unsupported(kind: Kind, b: &Body, n: usize) -> Result<(), ApiError> {
    let present = |k: &str| b.get(k).is_some_and(|v| !v.is_null());
    if kind == Kind::Text {
        if present("suffix") {
            return Err(ApiError::bad(
                "suffix (fill-in-the-middle) is not supported",
                Some("suffix"),
            ));
        }
        if let Some(best) = b.get("best_of").filter(|v| !v.is_null()) {
            if best.as_u64() != Some(n as u64) {
                return Err(ApiError::bad(
                    "best_of is not supported (other than equal to n)",
                    Some("best_of"),
                ));
            }
        }
        if b.get("echo").and_then(Value::as_bool) == Some(true) && present("logprobs") {
            return Err(ApiError::bad(
                "echo with logprobs (the prompt's log-probabilities) is not supported",
                Some("echo"),
            ));
        }
    }
    if kind == Kind::Chat {
        let other = b
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .find_map(|p| {
                p.get("type")
                    .and_then(Value::as_str)
                    .filter(|t| !matches!(*t, "text" | "image_url"))
            });
        if let Some(t) = other {
            return Err(ApiError::bad(
                format!("content parts of type {t:?} are not supported (text and image_url are)"),
                Some("messages"),
            ));
        }
    }
    Ok(())
}

/// With `echo: true`, the text a completion starts with: the prompt as given (a string), or
/// its ids decoded.
pub fn echo_text(state: &AppState, b: &Body, ids: &[u32]) -> Result<Option<String>, ApiError> {
    if !boolean(b, "echo")?.unwrap_or(false) {
        return Ok(None);
    }
    Ok(Some(match b.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(v)) if v.len() == 1 && v[0].is_string() => {
            v[0].as_str().unwrap_or("").to_string()
        }
        _ => state.tokenizer.decode(ids),
    }))
}

/// A /v1/completions prompt: a string, a one-string list, or a list of token ids.
pub fn completion_prompt(state: &AppState, b: &Body) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::bad(
            "prompt must be a string or a list of token ids",
            Some("prompt"),
        )
    };
    let text = |s: &str| {
        state
            .tokenizer
            .encode(s, true)
            .map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))
    };
    let ids = match b.get("prompt") {
        Some(Value::String(s)) => text(s)?,
        Some(Value::Array(v)) if v.len() == 1 && v[0].is_string() => {
            text(v[0].as_str().unwrap_or(""))?
        }
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

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Force {
    /// The model decides (`auto`).
    Auto,
    /// At least one call (`required`).
    Required,
    /// A call of this function.
    Named(String),
}

/// The request's `tools` (a list of `{"type": "function", "function": {"name": …}}`, or none,
/// also with `tool_choice: "none"`) and what `tool_choice` forces.
fn tools(b: &Body) -> Result<(Option<Vec<Value>>, Force), ApiError> {
    let bad_choice = || {
        ApiError::bad(
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
            Some("tool_choice"),
        )
    };
    let (none, force) = match b.get("tool_choice") {
        None | Some(Value::Null) => (false, Force::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => (false, Force::Auto),
            "none" => (true, Force::Auto),
            "required" => (false, Force::Required),
            _ => return Err(bad_choice()),
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(bad_choice)?;
            (false, Force::Named(name.to_string()))
        }
        Some(_) => return Err(bad_choice()),
    };
    let list = match b.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(v)) => v.clone(),
        Some(_) => return Err(ApiError::bad("tools must be a list", Some("tools"))),
    };
    for t in &list {
        let named = t
            .get("function")
            .and_then(|f| f.get("name"))
            .is_some_and(Value::is_string);
        if t.get("type").and_then(Value::as_str) != Some("function") || !named {
            return Err(ApiError::bad(
                "each tool must be {\"type\": \"function\", \"function\": {\"name\": …}}",
                Some("tools"),
            ));
        }
    }
    if force != Force::Auto && list.is_empty() {
        return Err(ApiError::bad(
            "tool_choice forces a tool call but tools is empty",
            Some("tool_choice"),
        ));
    }
    if let Force::Named(n) = &force {
        let known = list
            .iter()
            .any(|t| t["function"]["name"].as_str() == Some(n.as_str()));
        if !known {
            return Err(ApiError::bad(
                format!("tool_choice names {n:?}, which is not in tools"),
                Some("tool_choice"),
            ));
        }
    }
    Ok(((!none && !list.is_empty()).then_some(list), force))
}

/// A tag in a Lark grammar: the vocabulary's control token (`<[id]>`) when it has the tag
/// as one, else its text.
pub fn lark_tag(state: &AppState, tag: &str) -> String {
    match state.tokenizer.token_to_id(tag) {
        Some(id) if state.tokenizer.is_special(id) => format!("<[{id}]>"),
        _ => json!(tag).to_string(),
    }
}

/// The grammar of a forced tool call in the format the model's template uses (Hermes JSON,
/// Qwen XML or Gemma 4's; see [`kiln_core::chat::calls`]): once, or (`required` with
/// `parallel_tool_calls` not false) several times. Its tags are matched as the vocabulary's
/// tokens where it has them as control tokens.
fn tool_grammar(
    state: &AppState,
    syntax: Syntax,
    tools: &[Value],
    force: &Force,
    parallel: bool,
    in_reasoning: bool,
) -> GrammarSpec {
    let special: Vec<(&'static str, u32)> = [
        "<tool_call>",
        "</tool_call>",
        "<|tool_call>",
        "<tool_call|>",
        "</think>",
        "<channel|>",
    ]
    .into_iter()
    .filter_map(|t| {
        let id = state.tokenizer.token_to_id(t)?;
        state.tokenizer.is_special(id).then_some((t, id))
    })
    .collect();
    let (only, calls) = match force {
        Force::Named(n) => (Some(n.as_str()), Calls::One),
        _ if parallel => (None, Calls::Many),
        _ => (None, Calls::One),
    };
    GrammarSpec::Lark(tool_call_grammar(
        syntax,
        tools,
        only,
        calls,
        in_reasoning,
        Box::new(move |t| special.iter().find(|(s, _)| *s == t).map(|&(_, id)| id)),
    ))
}

/// A chat request's prompt tokens, and how its output is to be parsed.
pub fn chat_prompt(state: &AppState, b: &Body) -> Result<ChatPrompt, ApiError> {
    let (text, tools, force, images) = chat_text(state, b)?;
    let syntax = Syntax {
        tool_calls: state.syntax.tool_calls && tools.is_some(),
        ..state.syntax
    };
    let in_reasoning = syntax.prompt_opens_reasoning(&text);
    let grammar = match (&tools, &force) {
        (Some(list), Force::Required | Force::Named(_)) => {
            if !syntax.tool_calls {
                return Err(ApiError::bad(
                    "this model's chat template has no tool-call format, so a tool call cannot be forced",
                    Some("tool_choice"),
                ));
            }
            let parallel = boolean(b, "parallel_tool_calls")?.unwrap_or(true);
            Some(tool_grammar(
                state,
                syntax,
                list,
                &force,
                parallel,
                in_reasoning,
            ))
        }
        _ => None,
    };
    let (ids, images) = match (&state.vision, images.is_empty()) {
        (_, true) => (
            state
                .tokenizer
                .encode_chat(&text)
                .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))?,
            Vec::new(),
        ),
        (None, false) => return Err(ApiError::internal("images without a vision tower")),
        (Some((tower, token)), false) => {
            crate::images::place(&state.tokenizer, (tower, *token), &text, &images, true)
                .map_err(|e| ApiError::bad(format!("images: {e}"), Some("messages")))?
        }
    };
    Ok(ChatPrompt {
        ids,
        syntax,
        in_reasoning,
        grammar,
        tools: tools.unwrap_or_default(),
        images,
    })
}

/// The text, tools, forced tool and images of a chat request.
pub type ChatText = (
    String,
    Option<Vec<Value>>,
    Force,
    Vec<Arc<kiln_core::vision::Image>>,
);

/// A chat request's messages rendered by the model's template (with the generation prompt),
/// the tools offered, what `tool_choice` forces, and the images of its `image_url` parts in
/// order (a message with images reaches the template as a list of `text` and `image` parts,
/// as transformers' processors give it; others as a string).
pub fn chat_text(state: &AppState, b: &Body) -> Result<ChatText, ApiError> {
    let tpl = state
        .template
        .as_ref()
        .ok_or_else(|| match &state.template_error {
            Some(e) => ApiError::bad(
                format!("this model's chat template does not compile ({e}); use /v1/completions"),
                None,
            ),
            None => ApiError::bad("this model has no chat template; use /v1/completions", None),
        })?;
    let list = b
        .get("messages")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad("messages must be a non-empty list", Some("messages")))?;
    let mut messages = Vec::with_capacity(list.len());
    let mut images = Vec::new();
    for m in list {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::bad(
                "each message must be an object",
                Some("messages"),
            ));
        };
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad(
                format!("unknown message role {role:?}"),
                Some("messages"),
            ));
        }
        let content = match obj.get("content") {
            Some(Value::String(s)) => Value::String(s.clone()),
            None | Some(Value::Null) => Value::String(String::new()),
            // Content parts: the text ones concatenated, unless there are images.
            Some(Value::Array(parts)) => {
                let sink = state.vision.as_ref().map(|_| &mut images);
                crate::images::content_parts(parts, sink, &state.image_urls)
                    .map_err(|e| ApiError::bad(e, Some("messages")))?
            }
            Some(_) => {
                return Err(ApiError::bad(
                    "message content must be a string or a list of parts",
                    Some("messages"),
                ))
            }
        };
        let mut msg = obj.clone();
        msg.insert(
            "role".into(),
            Value::String(if role == "developer" { "system" } else { role }.into()),
        );
        msg.insert("content".into(), content);
        // Templates iterate a call's arguments (Qwen3.5's `arguments|items`, Gemma 4's
        // `dictsort`): the JSON text OpenAI clients send becomes the object it encodes.
        if let Some(Value::Array(calls)) = msg.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                let parsed = c["function"]["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str::<Value>(a).ok())
                    .filter(Value::is_object);
                if let Some(obj) = parsed {
                    c["function"]["arguments"] = obj;
                }
            }
        }
        messages.push(Value::Object(msg));
    }
    let (tools, force) = tools(b)?;
    let listed = tools.clone().map(Value::Array);
    let kwargs = match b.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(ApiError::bad(
                "chat_template_kwargs must be an object",
                Some("chat_template_kwargs"),
            ))
        }
    };
    let text = state.render_template(tpl, &messages, listed.as_ref(), &kwargs)?;
    Ok((text, tools, force, images))
}

/// A chat request's prompt and what it implies for the output.
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// How the output is split into content, reasoning and tool calls.
    pub syntax: Syntax,
    /// The prompt left the model inside `<think>`.
    pub in_reasoning: bool,
    /// The grammar of a tool call that `tool_choice` forces.
    pub grammar: Option<GrammarSpec>,
    /// The tools offered.
    pub tools: Vec<Value>,
    /// Its images, placed at their soft tokens.
    pub images: Vec<kiln_core::engine::PromptImage>,
}
