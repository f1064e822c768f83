//! Anthropic's Messages API (`/v1/messages`) and OpenAI's Responses API (`/v1/responses`),
//! mapped onto the chat engine: each request is translated into a chat-completions body
//! (messages, tools, tool choice, sampling, structured output), generated exactly as
//! `/v1/chat/completions` generates, and answered in its own API's shapes, streamed (server-
//! sent events with that API's event names) or whole, with that API's error shape.
//!
//! Both are stateless: the Responses API's `previous_response_id` is refused (send the whole
//! conversation) and nothing is stored (`store` is answered as `false`).
//!
//! This file holds what both share: the request translation helpers, the block events a
//! generation's pieces become, and the SSE response; `messages.rs` and `responses.rs` the
//! rest of each API.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Json, Response};
use kiln_core::chat::parse::ToolCall;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::request::{body_json, ApiError, Body, GenSpec};
use super::respond::{launch, Piece};
use super::{body_bytes, chat_spec, prepare_blocking, AppState};

mod messages;
mod responses;

pub use messages::messages;
pub use responses::responses;

/// Which API a request came in by.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Api {
    Messages,
    Responses,
}

/// The error in the API's own shape.
pub(super) fn error(api: Api, e: ApiError) -> Response {
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

pub(super) fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad(m, None)
}

/// Text of a content value: a string, or the text of its text parts.
pub(super) fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
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

/// A content value as chat completions takes it: its text (see [`text_of`]), or where it
/// holds images (Responses' `input_image`, Anthropic's `image` blocks), its text and image
/// parts in order as OpenAI `text` and `image_url` parts.
pub(super) fn parts_of(v: &Value, what: &str) -> Result<Value, ApiError> {
    let Value::Array(parts) = v else {
        return Ok(Value::String(text_of(v, what)?));
    };
    if !parts.iter().any(|p| image_url_of(p).is_some()) {
        return Ok(Value::String(text_of(v, what)?));
    }
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        match image_url_of(p) {
            Some(url) => out.push(json!({"type": "image_url", "image_url": {"url": url?}})),
            None => out.push(
                json!({"type": "text", "text": text_of(&Value::Array(vec![p.clone()]), what)?}),
            ),
        }
    }
    Ok(Value::Array(out))
}

/// The image URL of an image part (`None`: not an image): Responses' `input_image`
/// (`image_url`), or Anthropic's `image` block (a base64 `source` becomes a data URL).
pub(super) fn image_url_of(p: &Value) -> Option<Result<String, ApiError>> {
    match p.get("type").and_then(Value::as_str)? {
        "input_image" => Some(match p.get("image_url").and_then(Value::as_str) {
            Some(u) => Ok(u.to_string()),
            None => Err(bad(
                "an input_image needs an image_url (file_id is not supported)",
            )),
        }),
        "image" => {
            let src = p.get("source");
            let kind = src.and_then(|s| s.get("type")).and_then(Value::as_str);
            Some(match kind {
                Some("base64") => {
                    let media = src
                        .and_then(|s| s.get("media_type"))
                        .and_then(Value::as_str)
                        .unwrap_or("image/png");
                    let data = src
                        .and_then(|s| s.get("data"))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    Ok(format!("data:{media};base64,{data}"))
                }
                Some("url") => Ok(src
                    .and_then(|s| s.get("url"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()),
                _ => Err(bad("an image block needs a base64 source (or a url one)")),
            })
        }
        _ => None,
    }
}

/// Copies the sampling keys both APIs share with chat completions.
pub(super) fn copy_keys(from: &Body, to: &mut Body, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k) {
            to.insert((*k).to_string(), v.clone());
        }
    }
}

pub(super) fn function_tool(
    name: &Value,
    description: Option<&Value>,
    parameters: Option<&Value>,
) -> Value {
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
pub(super) fn client_tools(
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
pub(super) fn thinking(out: &mut Body, on: bool) {
    let kw = out
        .entry("chat_template_kwargs")
        .or_insert_with(|| json!({}));
    if let Some(m) = kw.as_object_mut() {
        m.entry("enable_thinking").or_insert(json!(on));
    }
}

/// A generation's output as it streams: content blocks opened, filled and closed in order.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Block {
    Reasoning,
    Text,
    Call(ToolCall),
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Ev {
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
pub(super) struct Blocks {
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
pub(super) struct Whole {
    blocks: Vec<(Block, String)>,
    finish: &'static str,
    stop_sequence: Option<String>,
    completion: usize,
    cached: usize,
}

/// Gathers a non-streamed generation.
pub(super) async fn gather(mut rx: mpsc::Receiver<Piece>) -> Result<Whole, ApiError> {
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
pub(super) async fn begin(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    api: Api,
) -> Result<(GenSpec, mpsc::Receiver<Piece>), ApiError> {
    let bytes = body_bytes(body)?;
    let spec = prepare_blocking(state, move |st| {
        let b = body_json(&bytes)?;
        let chat = match api {
            Api::Messages => messages::messages_to_chat(&b)?,
            Api::Responses => responses::responses_to_chat(&b)?,
        };
        chat_spec(st, &chat)
    })
    .await?;
    let rx = launch(state, &spec)?;
    Ok((spec, rx))
}

/// The SSE response: the `start` events, then each batch `body` yields.
pub(super) fn sse_response(
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

pub(super) fn sse(events: Vec<(&'static str, Value)>) -> Vec<Result<SseEvent, Infallible>> {
    events
        .into_iter()
        .map(|(name, data)| Ok(SseEvent::default().event(name).data(data.to_string())))
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn body(v: Value) -> Body {
        v.as_object().cloned().unwrap_or_default()
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
