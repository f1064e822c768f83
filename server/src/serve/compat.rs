//! Anthropic's Messages API (`/v1/messages`) and OpenAI's Responses API (`/v1/responses`),
//! mapped onto the chat engine: each request is translated into a chat-completions body
//! (messages, tools, tool choice, sampling, structured output), generated exactly as
//! `/v1/chat/completions` generates, and answered in its own API's shapes, streamed (server-
//! sent events with that API's event names) or whole, with that API's error shape.
//!
//! Both are stateless: the Responses API's `previous_response_id` is refused (send the whole
//! conversation) and nothing is stored (`store` is answered as `false`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Json, Response};
use kiln_core::chat::parse::ToolCall;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::request::{body_json, ApiError, Body, GenSpec};
use super::respond::{launch, rand_bits, Piece};
use super::{body_bytes, chat_spec, now, AppState};

/// Which API a request came in by.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Api {
    Messages,
    Responses,
}

/// The error in the API's own shape.
fn error(api: Api, e: ApiError) -> Response {
    match api {
        Api::Responses => e.into_response(),
        Api::Messages => {
            let kind = match e.status {
                StatusCode::UNAUTHORIZED => "authentication_error",
                StatusCode::FORBIDDEN => "permission_error",
                StatusCode::NOT_FOUND => "not_found_error",
                StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
                StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
                StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
                s if s.is_server_error() => "api_error",
                _ => "invalid_request_error",
            };
            let body = json!({"type": "error",
                              "error": {"type": kind, "message": e.message}});
            (e.status, Json(body)).into_response()
        }
    }
}

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad(m, None)
}

/// Text of a content value: a string, or the text of its text parts.
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text" | "input_text" | "output_text") => {
                        out.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(t) => {
                        return Err(bad(format!(
                            "{what}: content of type {t:?} is not supported (text only)"
                        )))
                    }
                    None => return Err(bad(format!("{what}: a content part has no type"))),
                }
            }
            Ok(out)
        }
        _ => Err(bad(format!("{what}: content must be a string or a list"))),
    }
}

/// Copies the sampling keys both APIs share with chat completions.
fn copy_keys(from: &Body, to: &mut Body, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k) {
            to.insert((*k).to_string(), v.clone());
        }
    }
}

fn function_tool(name: &Value, description: Option<&Value>, parameters: Option<&Value>) -> Value {
    let mut f = json!({ "name": name });
    if let Some(d) = description {
        f["description"] = d.clone();
    }
    f["parameters"] = parameters
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    json!({"type": "function", "function": f})
}

/// The request's `tools` as chat-completions function tools: each must pass `accepted`
/// (else `refusal`), have a `name`, and has its schema under `schema_key`.
fn client_tools(
    b: &Body,
    accepted: impl Fn(&Value) -> bool,
    schema_key: &str,
    refusal: &str,
) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = b.get("tools").filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad("tools must be a list", Some("tools")))?;
    let mut fns = Vec::with_capacity(list.len());
    for t in list {
        if !accepted(t) {
            return Err(ApiError::bad(refusal, Some("tools")));
        }
        let name = t
            .get("name")
            .filter(|n| n.is_string())
            .ok_or_else(|| ApiError::bad("each tool needs a name", Some("tools")))?;
        fns.push(function_tool(name, t.get("description"), t.get(schema_key)));
    }
    Ok(Some(fns))
}

/// Sets `enable_thinking` among the template's variables (unless the request set it).
fn thinking(out: &mut Body, on: bool) {
    let kw = out
        .entry("chat_template_kwargs")
        .or_insert_with(|| json!({}));
    if let Some(m) = kw.as_object_mut() {
        m.entry("enable_thinking").or_insert(json!(on));
    }
}

/// An Anthropic Messages request as a chat-completions body.
fn messages_to_chat(b: &Body) -> Result<Body, ApiError> {
    let mut out = Map::new();
    match b.get("max_tokens") {
        Some(v) if v.is_u64() => {
            out.insert("max_tokens".into(), v.clone());
        }
        _ => {
            return Err(ApiError::bad(
                "max_tokens is required (a positive integer)",
                Some("max_tokens"),
            ))
        }
    }
    copy_keys(
        b,
        &mut out,
        &[
            "model",
            "temperature",
            "top_p",
            "top_k",
            "stream",
            "chat_template_kwargs",
        ],
    );
    // Extended thinking on or off reaches a template that has the switch.
    if let Some(t) = b
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        thinking(&mut out, t != "disabled");
    }
    if let Some(s) = b.get("stop_sequences") {
        out.insert("stop".into(), s.clone());
    }
    // Structured output: `output_config.format = {"type": "json_schema", "schema": …}`.
    if let Some(f) = b
        .get("output_config")
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    {
        if f.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(ApiError::bad(
                "output_config.format.type must be \"json_schema\"",
                Some("output_config"),
            ));
        }
        out.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"schema": f.get("schema")}}),
        );
    }
    let mut msgs: Vec<Value> = Vec::new();
    match b.get("system") {
        None | Some(Value::Null) => {}
        Some(s) => msgs.push(json!({"role": "system", "content": text_of(s, "system")?})),
    }
    let list = b
        .get("messages")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad("messages must be a non-empty list", Some("messages")))?;
    for m in list {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad(
                format!("message role must be \"user\" or \"assistant\", not {role:?}"),
                Some("messages"),
            ));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(v)) => v.clone(),
            _ => {
                return Err(ApiError::bad(
                    "message content must be a string or a list of blocks",
                    Some("messages"),
                ))
            }
        };
        let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        for blk in &blocks {
            match blk.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(blk.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("thinking") => thinking
                    .push_str(blk.get("thinking").and_then(Value::as_str).unwrap_or("")),
                Some("redacted_thinking") => {}
                Some("tool_use") if role == "assistant" => {
                    let input = blk.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({"id": blk.get("id").cloned().unwrap_or(Value::Null),
                        "type": "function",
                        "function": {"name": blk.get("name").cloned().unwrap_or(Value::Null),
                                     "arguments": input.to_string()}}));
                }
                Some("tool_result") if role == "user" => {
                    // A tool's answer is a message of its own, before the user's text.
                    let mut content =
                        text_of(blk.get("content").unwrap_or(&Value::Null), "tool_result")?;
                    if blk.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    msgs.push(json!({"role": "tool",
                        "tool_call_id": blk.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": content}));
                }
                Some(t) => {
                    return Err(ApiError::bad(
                        format!("a {role} message cannot hold a {t:?} block here (text, thinking, tool_use and tool_result are supported)"),
                        Some("messages"),
                    ))
                }
                None => return Err(ApiError::bad("a content block has no type", Some("messages"))),
            }
        }
        if role == "user" && text.is_empty() && blocks.iter().all(|b| b["type"] == "tool_result") {
            continue;
        }
        let mut msg = json!({"role": role, "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if !thinking.is_empty() {
            msg["reasoning_content"] = Value::String(thinking);
        }
        msgs.push(msg);
    }
    out.insert("messages".into(), Value::Array(msgs));
    if let Some(fns) = client_tools(
        b,
        |t| {
            t.get("type")
                .and_then(Value::as_str)
                .is_none_or(|ty| ty == "custom")
        },
        "input_schema",
        "only client tools ({\"name\", \"input_schema\"}) are supported",
    )? {
        out.insert("tools".into(), Value::Array(fns));
    }
    if let Some(c) = b.get("tool_choice").filter(|c| !c.is_null()) {
        let choice = match c.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": c.get("name")}}),
            _ => {
                return Err(ApiError::bad(
                    "tool_choice.type must be auto, any, tool or none",
                    Some("tool_choice"),
                ))
            }
        };
        out.insert("tool_choice".into(), choice);
        if c.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    Ok(out)
}

/// An OpenAI Responses request as a chat-completions body.
fn responses_to_chat(b: &Body) -> Result<Body, ApiError> {
    if b.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad(
            "previous_response_id is not supported: this server stores no responses; send the whole conversation as input",
            Some("previous_response_id"),
        ));
    }
    let mut out = Map::new();
    copy_keys(
        b,
        &mut out,
        &[
            "model",
            "temperature",
            "top_p",
            "stream",
            "parallel_tool_calls",
            "chat_template_kwargs",
        ],
    );
    // `reasoning.effort` "none" (or "minimal") asks for no thinking; any other for thinking.
    if let Some(e) = b
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        thinking(&mut out, !matches!(e, "none" | "minimal"));
    }
    if let Some(m) = b.get("max_output_tokens").filter(|v| !v.is_null()) {
        out.insert("max_tokens".into(), m.clone());
    }
    let mut msgs: Vec<Value> = Vec::new();
    match b.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => msgs.push(json!({"role": "system", "content": s})),
        Some(_) => {
            return Err(ApiError::bad(
                "instructions must be a string",
                Some("instructions"),
            ))
        }
    }
    match b.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) if !items.is_empty() => {
            for it in items {
                let ty = it.get("type").and_then(Value::as_str).unwrap_or("message");
                match ty {
                    "message" => {
                        let role = it.get("role").and_then(Value::as_str).unwrap_or("");
                        if !matches!(role, "user" | "assistant" | "system" | "developer") {
                            return Err(ApiError::bad(
                                format!("unknown input role {role:?}"),
                                Some("input"),
                            ));
                        }
                        let content = text_of(it.get("content").unwrap_or(&Value::Null), "input")?;
                        msgs.push(json!({"role": role, "content": content}));
                    }
                    "function_call" => {
                        let call = json!({"id": it.get("call_id"), "type": "function",
                            "function": {"name": it.get("name"),
                                         "arguments": it.get("arguments").and_then(Value::as_str).unwrap_or("{}")}});
                        // Calls of one turn go into one assistant message.
                        match msgs.last_mut() {
                            Some(last)
                                if last["role"] == "assistant"
                                    && last.get("tool_calls").is_some() =>
                            {
                                if let Some(v) = last["tool_calls"].as_array_mut() {
                                    v.push(call);
                                }
                            }
                            _ => msgs.push(json!({"role": "assistant", "content": "",
                                                  "tool_calls": [call]})),
                        }
                    }
                    "function_call_output" => {
                        let output = match it.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(o) => text_of(o, "function_call_output")?,
                            None => String::new(),
                        };
                        msgs.push(json!({"role": "tool", "tool_call_id": it.get("call_id"),
                                         "content": output}));
                    }
                    // The model's earlier reasoning is not replayed.
                    "reasoning" => {}
                    t => {
                        return Err(ApiError::bad(
                            format!("input items of type {t:?} are not supported"),
                            Some("input"),
                        ))
                    }
                }
            }
        }
        _ => {
            return Err(ApiError::bad(
                "input must be a string or a non-empty list of items",
                Some("input"),
            ))
        }
    }
    out.insert("messages".into(), Value::Array(msgs));
    if let Some(fns) = client_tools(
        b,
        |t| t.get("type").and_then(Value::as_str) == Some("function"),
        "parameters",
        "only function tools are supported",
    )? {
        out.insert("tools".into(), Value::Array(fns));
    }
    if let Some(c) = b.get("tool_choice").filter(|c| !c.is_null()) {
        let choice = match c {
            Value::String(_) => c.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "function": {"name": o.get("name")}})
            }
            _ => return Err(ApiError::bad(
                "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": …}",
                Some("tool_choice"),
            )),
        };
        out.insert("tool_choice".into(), choice);
    }
    if let Some(f) = b.get("text").and_then(|t| t.get("format")) {
        let fmt = match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": f.get("name"), "schema": f.get("schema"), "strict": f.get("strict")}}),
            Some("json_object") => json!({"type": "json_object"}),
            Some("text") | None => json!({"type": "text"}),
            Some(t) => {
                return Err(ApiError::bad(
                    format!("text.format type {t:?} is not supported"),
                    Some("text"),
                ))
            }
        };
        out.insert("response_format".into(), fmt);
    }
    Ok(out)
}

/// A generation's output as it streams: content blocks opened, filled and closed in order.
#[derive(Clone, Debug, PartialEq)]
enum Block {
    Reasoning,
    Text,
    Call(ToolCall),
}

#[derive(Clone, Debug, PartialEq)]
enum Ev {
    Start(Block),
    Delta(String),
    Stop,
    End {
        finish: &'static str,
        stop_sequence: Option<String>,
        completion: usize,
        cached: usize,
    },
    Failed(String),
}

/// Turns pieces into block events: reasoning, then text, then each tool call, each block
/// closed before the next opens.
#[derive(Default)]
struct Blocks {
    open: Option<Block>,
}

impl Blocks {
    fn ensure(&mut self, b: Block, out: &mut Vec<Ev>) {
        if self.open.as_ref() != Some(&b) {
            if self.open.take().is_some() {
                out.push(Ev::Stop);
            }
            out.push(Ev::Start(b.clone()));
            self.open = Some(b);
        }
    }

    fn feed(&mut self, p: Piece) -> Vec<Ev> {
        let mut out = Vec::new();
        match p {
            Piece::Out {
                content,
                reasoning,
                calls,
                ..
            } => {
                if !reasoning.is_empty() {
                    self.ensure(Block::Reasoning, &mut out);
                    out.push(Ev::Delta(reasoning));
                }
                if !content.is_empty() {
                    self.ensure(Block::Text, &mut out);
                    out.push(Ev::Delta(content));
                }
                for mut c in calls {
                    if self.open.take().is_some() {
                        out.push(Ev::Stop);
                    }
                    // Both APIs carry arguments as a JSON object.
                    c.arguments = object_args(&c.arguments);
                    out.push(Ev::Start(Block::Call(c.clone())));
                    out.push(Ev::Delta(c.arguments));
                    out.push(Ev::Stop);
                }
            }
            Piece::End {
                finish,
                stop_sequence,
                completion,
                cached,
                ..
            } => {
                if self.open.take().is_some() {
                    out.push(Ev::Stop);
                }
                out.push(Ev::End {
                    finish,
                    stop_sequence,
                    completion,
                    cached,
                });
            }
            Piece::Draft { .. } => {}
            Piece::Failed(e) => out.push(Ev::Failed(e)),
        }
        out
    }
}

/// A call's arguments as a JSON object's text: as written when they are one, `{}` otherwise
/// (a model may write a string or a list).
fn object_args(a: &str) -> String {
    match serde_json::from_str::<Value>(a) {
        Ok(v @ Value::Object(_)) => v.to_string(),
        _ => "{}".to_string(),
    }
}

/// A finished output, block by block.
#[derive(Default)]
struct Whole {
    blocks: Vec<(Block, String)>,
    finish: &'static str,
    stop_sequence: Option<String>,
    completion: usize,
    cached: usize,
}

/// Gathers a non-streamed generation.
async fn gather(mut rx: mpsc::Receiver<Piece>) -> Result<Whole, ApiError> {
    let mut blocks = Blocks::default();
    let mut w = Whole::default();
    while let Some(p) = rx.recv().await {
        for ev in blocks.feed(p) {
            match ev {
                Ev::Start(b) => w.blocks.push((b, String::new())),
                Ev::Delta(d) => {
                    if let Some(last) = w.blocks.last_mut() {
                        last.1.push_str(&d)
                    }
                }
                Ev::Stop => {}
                Ev::End {
                    finish,
                    stop_sequence,
                    completion,
                    cached,
                } => {
                    w.finish = finish;
                    w.stop_sequence = stop_sequence;
                    w.completion = completion;
                    w.cached = cached;
                    return Ok(w);
                }
                Ev::Failed(e) => return Err(ApiError::internal(e)),
            }
        }
    }
    Err(ApiError::internal(
        "the engine ended the request without a result",
    ))
}

/// Prepares the request (on a blocking thread) and starts it.
async fn begin(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Result<(GenSpec, mpsc::Receiver<Piece>), ApiError> {
    let bytes = body_bytes(body)?;
    let st = state.clone();
    let spec = tokio::task::spawn_blocking(move || {
        let b = body_json(&bytes)?;
        let chat = match api {
            Api::Messages => messages_to_chat(&b)?,
            Api::Responses => responses_to_chat(&b)?,
        };
        chat_spec(&st, &chat)
    })
    .await
    .unwrap_or_else(|e| {
        Err(ApiError::internal(format!(
            "preparing the request failed: {e}"
        )))
    })?;
    let rx = launch(state, &spec)?;
    Ok((spec, rx))
}

fn stop_reason(finish: &str, stop_sequence: &Option<String>) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ if stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// `POST /v1/messages` (Anthropic's Messages API).
pub async fn messages(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (spec, rx) = match begin(&state, body, Api::Messages).await {
        Ok(x) => x,
        Err(e) => return error(Api::Messages, e),
    };
    let id = format!("msg_{:016x}{:08x}", now(), rand_bits());
    let prompt = spec.prompt.len();
    if spec.stream {
        return messages_stream(state, rx, id, prompt);
    }
    let w = match gather(rx).await {
        Ok(w) => w,
        Err(e) => return error(Api::Messages, e),
    };
    let content: Vec<Value> = w
        .blocks
        .iter()
        .enumerate()
        .map(|(i, (b, text))| match b {
            Block::Reasoning => json!({"type": "thinking", "thinking": text, "signature": ""}),
            Block::Text => json!({"type": "text", "text": text}),
            Block::Call(c) => json!({"type": "tool_use", "id": format!("toolu_{id}_{i}"),
                "name": c.name,
                "input": serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!({}))}),
        })
        .collect();
    Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": state.model,
        "content": content,
        "stop_reason": stop_reason(w.finish, &w.stop_sequence),
        "stop_sequence": w.stop_sequence,
        "usage": {"input_tokens": prompt, "output_tokens": w.completion,
                  "cache_read_input_tokens": w.cached, "cache_creation_input_tokens": 0},
    }))
    .into_response()
}

/// The SSE response: the `start` events, then each batch `body` yields.
fn sse_response(
    start: Vec<(&'static str, Value)>,
    body: impl futures_util::Stream<Item = Vec<Result<SseEvent, Infallible>>> + Send + 'static,
) -> Response {
    let all = futures_util::StreamExt::chain(futures_util::stream::iter(vec![sse(start)]), body);
    Sse::new(futures_util::StreamExt::flat_map(
        all,
        futures_util::stream::iter,
    ))
    .into_response()
}

fn sse(events: Vec<(&'static str, Value)>) -> Vec<Result<SseEvent, Infallible>> {
    events
        .into_iter()
        .map(|(name, data)| Ok(SseEvent::default().event(name).data(data.to_string())))
        .collect()
}

fn messages_stream(
    state: Arc<AppState>,
    rx: mpsc::Receiver<Piece>,
    id: String,
    prompt: usize,
) -> Response {
    let start = vec![(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": state.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": 0}}}),
    )];
    struct St {
        rx: mpsc::Receiver<Piece>,
        blocks: Blocks,
        index: usize,
        open: Option<Block>,
        done: bool,
    }
    let st = St {
        rx,
        blocks: Blocks::default(),
        index: 0,
        open: None,
        done: false,
    };
    let body = futures_util::stream::unfold(st, move |mut st| {
        let id = id.clone();
        async move {
            if st.done {
                return None;
            }
            let mut out = Vec::new();
            let evs = match st.rx.recv().await {
                Some(p) => st.blocks.feed(p),
                None => vec![Ev::Failed(
                    "the engine ended the request without a result".into(),
                )],
            };
            for ev in evs {
                match ev {
                    Ev::Start(b) => {
                        let block = match &b {
                            Block::Reasoning => {
                                json!({"type": "thinking", "thinking": "", "signature": ""})
                            }
                            Block::Text => json!({"type": "text", "text": ""}),
                            Block::Call(c) => json!({"type": "tool_use",
                                "id": format!("toolu_{id}_{}", st.index), "name": c.name,
                                "input": {}}),
                        };
                        out.push((
                            "content_block_start",
                            json!({"type": "content_block_start", "index": st.index,
                                   "content_block": block}),
                        ));
                        st.open = Some(b);
                    }
                    Ev::Delta(d) => {
                        let delta = match &st.open {
                            Some(Block::Reasoning) => {
                                json!({"type": "thinking_delta", "thinking": d})
                            }
                            Some(Block::Call(_)) => {
                                json!({"type": "input_json_delta", "partial_json": d})
                            }
                            _ => json!({"type": "text_delta", "text": d}),
                        };
                        out.push((
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": st.index,
                                   "delta": delta}),
                        ));
                    }
                    Ev::Stop => {
                        if st.open == Some(Block::Reasoning) {
                            out.push((
                                "content_block_delta",
                                json!({"type": "content_block_delta", "index": st.index,
                                       "delta": {"type": "signature_delta", "signature": ""}}),
                            ));
                        }
                        out.push((
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": st.index}),
                        ));
                        st.index += 1;
                        st.open = None;
                    }
                    Ev::End {
                        finish,
                        stop_sequence,
                        completion,
                        ..
                    } => {
                        out.push((
                            "message_delta",
                            json!({"type": "message_delta",
                                   "delta": {"stop_reason": stop_reason(finish, &stop_sequence),
                                             "stop_sequence": stop_sequence},
                                   "usage": {"output_tokens": completion}}),
                        ));
                        out.push(("message_stop", json!({"type": "message_stop"})));
                        st.done = true;
                    }
                    Ev::Failed(e) => {
                        out.push((
                            "error",
                            json!({"type": "error",
                                   "error": {"type": "api_error", "message": e}}),
                        ));
                        st.done = true;
                    }
                }
            }
            Some((sse(out), st))
        }
    });
    sse_response(start, body)
}

/// A Responses output item for a finished block.
fn output_item(b: &Block, text: &str, id: &str, i: usize) -> Value {
    match b {
        Block::Reasoning => json!({"type": "reasoning", "id": format!("rs_{id}_{i}"),
            "summary": [], "content": [{"type": "reasoning_text", "text": text}]}),
        Block::Text => json!({"type": "message", "id": format!("msg_{id}_{i}"),
            "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}),
        Block::Call(c) => json!({"type": "function_call", "id": format!("fc_{id}_{i}"),
            "call_id": format!("call_{id}_{i}"), "name": c.name, "arguments": text,
            "status": "completed"}),
    }
}

/// The response object around `output`.
fn response_object(
    state: &AppState,
    req: &Body,
    id: &str,
    created: u64,
    output: Vec<Value>,
    end: Option<(&str, usize, usize, usize)>,
) -> Value {
    let (status, incomplete, usage) = match end {
        None => ("in_progress", Value::Null, Value::Null),
        Some((finish, prompt, completion, cached)) => (
            if finish == "length" {
                "incomplete"
            } else {
                "completed"
            },
            if finish == "length" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
            json!({"input_tokens": prompt, "output_tokens": completion,
                   "total_tokens": prompt + completion,
                   "input_tokens_details": {"cached_tokens": cached},
                   "output_tokens_details": {"reasoning_tokens": 0}}),
        ),
    };
    let get = |k: &str| req.get(k).cloned().unwrap_or(Value::Null);
    json!({
        "id": format!("resp_{id}"), "object": "response", "created_at": created,
        "status": status, "error": null, "incomplete_details": incomplete,
        "model": state.model, "output": output, "usage": usage,
        "instructions": get("instructions"), "max_output_tokens": get("max_output_tokens"),
        "temperature": get("temperature"), "top_p": get("top_p"),
        "parallel_tool_calls": req.get("parallel_tool_calls").and_then(Value::as_bool).unwrap_or(true),
        "tool_choice": req.get("tool_choice").cloned().unwrap_or_else(|| json!("auto")),
        "tools": req.get("tools").cloned().unwrap_or_else(|| json!([])),
        "text": req.get("text").cloned().unwrap_or_else(|| json!({"format": {"type": "text"}})),
        "previous_response_id": null, "store": false, "metadata": {},
    })
}

/// `POST /v1/responses` (OpenAI's Responses API, stateless).
pub async fn responses(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // The request's own fields are echoed in the response object.
    let req: Body = match &body {
        Ok(b) => body_json(b).unwrap_or_default(),
        Err(_) => Body::new(),
    };
    let (spec, rx) = match begin(&state, body, Api::Responses).await {
        Ok(x) => x,
        Err(e) => return error(Api::Responses, e),
    };
    let id = format!("{:016x}{:08x}", now(), rand_bits());
    let created = now();
    let prompt = spec.prompt.len();
    if spec.stream {
        return responses_stream(state, req, rx, id, created, prompt);
    }
    let w = match gather(rx).await {
        Ok(w) => w,
        Err(e) => return error(Api::Responses, e),
    };
    let output = w
        .blocks
        .iter()
        .enumerate()
        .map(|(i, (b, t))| output_item(b, t, &id, i))
        .collect();
    let end = Some((w.finish, prompt, w.completion, w.cached));
    Json(response_object(&state, &req, &id, created, output, end)).into_response()
}

fn responses_stream(
    state: Arc<AppState>,
    req: Body,
    rx: mpsc::Receiver<Piece>,
    id: String,
    created: u64,
    prompt: usize,
) -> Response {
    struct St {
        rx: mpsc::Receiver<Piece>,
        blocks: Blocks,
        open: Option<(Block, String)>,
        output: Vec<Value>,
        seq: u64,
        done: bool,
    }
    let first = response_object(&state, &req, &id, created, Vec::new(), None);
    let start = vec![
        (
            "response.created",
            json!({"type": "response.created", "sequence_number": 0, "response": first}),
        ),
        (
            "response.in_progress",
            json!({"type": "response.in_progress", "sequence_number": 1, "response": first}),
        ),
    ];
    let st = St {
        rx,
        blocks: Blocks::default(),
        open: None,
        output: Vec::new(),
        seq: 2,
        done: false,
    };
    let state2 = state.clone();
    let body = futures_util::stream::unfold(st, move |mut st| {
        let (id, req, state) = (id.clone(), req.clone(), state2.clone());
        async move {
            if st.done {
                return None;
            }
            let evs = match st.rx.recv().await {
                Some(p) => st.blocks.feed(p),
                None => vec![Ev::Failed(
                    "the engine ended the request without a result".into(),
                )],
            };
            let mut out: Vec<(&'static str, Value)> = Vec::new();
            let mut push = |st: &mut St, name: &'static str, mut v: Value| {
                v["type"] = json!(name);
                v["sequence_number"] = json!(st.seq);
                st.seq += 1;
                out.push((name, v));
            };
            for ev in evs {
                let i = st.output.len();
                match ev {
                    Ev::Start(b) => {
                        let mut item = output_item(&b, "", &id, i);
                        item["status"] = json!("in_progress");
                        if b == Block::Text {
                            item["content"] = json!([]);
                        }
                        push(
                            &mut st,
                            "response.output_item.added",
                            json!({"output_index": i, "item": item}),
                        );
                        if b == Block::Text {
                            push(
                                &mut st,
                                "response.content_part.added",
                                json!({
                                "item_id": format!("msg_{id}_{i}"), "output_index": i,
                                "content_index": 0,
                                "part": {"type": "output_text", "text": "", "annotations": []}}),
                            );
                        }
                        st.open = Some((b, String::new()));
                    }
                    Ev::Delta(d) => {
                        let Some((b, text)) = st.open.as_mut() else {
                            continue;
                        };
                        text.push_str(&d);
                        let (name, item_id) = match b {
                            Block::Reasoning => {
                                ("response.reasoning_text.delta", format!("rs_{id}_{i}"))
                            }
                            Block::Text => ("response.output_text.delta", format!("msg_{id}_{i}")),
                            Block::Call(_) => (
                                "response.function_call_arguments.delta",
                                format!("fc_{id}_{i}"),
                            ),
                        };
                        let mut v = json!({"item_id": item_id, "output_index": i, "delta": d});
                        if !matches!(b, Block::Call(_)) {
                            v["content_index"] = json!(0);
                        }
                        if matches!(b, Block::Text) {
                            v["logprobs"] = json!([]);
                        }
                        push(&mut st, name, v);
                    }
                    Ev::Stop => {
                        let Some((b, text)) = st.open.take() else {
                            continue;
                        };
                        match &b {
                            Block::Reasoning => push(
                                &mut st,
                                "response.reasoning_text.done",
                                json!({
                                "item_id": format!("rs_{id}_{i}"), "output_index": i,
                                "content_index": 0, "text": text}),
                            ),
                            Block::Text => {
                                push(
                                    &mut st,
                                    "response.output_text.done",
                                    json!({
                                    "item_id": format!("msg_{id}_{i}"), "output_index": i,
                                    "content_index": 0, "text": text, "logprobs": []}),
                                );
                                push(
                                    &mut st,
                                    "response.content_part.done",
                                    json!({
                                    "item_id": format!("msg_{id}_{i}"), "output_index": i,
                                    "content_index": 0,
                                    "part": {"type": "output_text", "text": text, "annotations": []}}),
                                );
                            }
                            Block::Call(c) => push(
                                &mut st,
                                "response.function_call_arguments.done",
                                json!({
                                "item_id": format!("fc_{id}_{i}"), "output_index": i,
                                "name": c.name, "arguments": text}),
                            ),
                        }
                        let item = output_item(&b, &text, &id, i);
                        push(
                            &mut st,
                            "response.output_item.done",
                            json!({"output_index": i, "item": item}),
                        );
                        st.output.push(item);
                    }
                    Ev::End {
                        finish,
                        completion,
                        cached,
                        ..
                    } => {
                        let resp = response_object(
                            &state,
                            &req,
                            &id,
                            created,
                            st.output.clone(),
                            Some((finish, prompt, completion, cached)),
                        );
                        let name = if finish == "length" {
                            "response.incomplete"
                        } else {
                            "response.completed"
                        };
                        push(&mut st, name, json!({"response": resp}));
                        st.done = true;
                    }
                    Ev::Failed(e) => {
                        push(
                            &mut st,
                            "error",
                            json!({"code": "server_error", "message": e, "param": null}),
                        );
                        st.done = true;
                    }
                }
            }
            Some((sse(out), st))
        }
    });
    sse_response(start, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Body {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn anthropic_messages_become_chat_messages() {
        let b = body(json!({
        "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["END"], "tool_choice": {"type": "any"},
        "tools": [{"name": "get_weather", "description": "d",
                   "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "-3 C"}]},
                {"type": "text", "text": "Thanks"}]},
        ]}));
        let c = Value::Object(messages_to_chat(&b).expect("translates"));
        assert_eq!(c["max_tokens"], 50);
        assert_eq!(c["stop"], json!(["END"]));
        assert_eq!(c["tool_choice"], "required");
        assert_eq!(c["tools"][0]["function"]["name"], "get_weather");
        let m = c["messages"].as_array().expect("messages");
        let roles: Vec<&str> = m.iter().map(|x| x["role"].as_str().unwrap_or("")).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Oslo\"}"
        );
        assert_eq!(m[2]["reasoning_content"], "hmm");
        assert_eq!(m[3]["tool_call_id"], "t1");
        assert_eq!(m[3]["content"], "-3 C");
        assert!(messages_to_chat(&body(json!({"messages": []}))).is_err());
        let t = messages_to_chat(&body(
            json!({"max_tokens": 5, "thinking": {"type": "enabled",
            "budget_tokens": 100}, "messages": [{"role": "user", "content": "x"}]}),
        ))
        .expect("translates");
        assert_eq!(t["chat_template_kwargs"]["enable_thinking"], true);
        assert!(messages_to_chat(&body(json!({"max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]})))
        .is_err());
    }

    #[test]
    fn responses_input_items_become_chat_messages() {
        let b = body(json!({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 20,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "-3 C"},
        ]}));
        let c = Value::Object(responses_to_chat(&b).expect("translates"));
        assert_eq!(c["max_tokens"], 20);
        assert_eq!(
            c["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        let m = c["messages"].as_array().expect("messages");
        let roles: Vec<&str> = m.iter().map(|x| x["role"].as_str().unwrap_or("")).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(m[2]["tool_calls"].as_array().map(Vec::len), Some(2));
        assert!(
            responses_to_chat(&body(json!({"input": "x", "previous_response_id": "r"}))).is_err()
        );
    }

    #[test]
    fn blocks_open_and_close_in_order() {
        let mut b = Blocks::default();
        let out = |reasoning: &str, content: &str, calls: Vec<ToolCall>| Piece::Out {
            index: 0,
            content: content.into(),
            reasoning: reasoning.into(),
            calls,
            logprobs: Vec::new(),
        };
        let mut evs = b.feed(out("a", "", Vec::new()));
        evs.extend(b.feed(out("b", "c", Vec::new())));
        let call = ToolCall {
            index: 0,
            name: "f".into(),
            arguments: "{}".into(),
        };
        evs.extend(b.feed(out("", "", vec![call.clone()])));
        assert_eq!(
            evs,
            vec![
                Ev::Start(Block::Reasoning),
                Ev::Delta("a".into()),
                Ev::Delta("b".into()),
                Ev::Stop,
                Ev::Start(Block::Text),
                Ev::Delta("c".into()),
                Ev::Stop,
                Ev::Start(Block::Call(call)),
                Ev::Delta("{}".into()),
                Ev::Stop,
            ]
        );
    }
}
