//! Anthropic's Messages API (`/v1/messages`) on the chat engine.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Json, Response};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::*;
use crate::serve::respond::{rand_bits, Piece};
use crate::serve::{now, AppState};

/// An Anthropic Messages request as a chat-completions body.
pub(super) fn messages_to_chat(b: &Body) -> Result<Body, ApiError> {
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
        // With images: the text and image parts in order.
        let mut parts: Vec<Value> = Vec::new();
        for blk in &blocks {
            match blk.get("type").and_then(Value::as_str) {
                Some("text") => {
                    let t = blk.get("text").and_then(Value::as_str).unwrap_or("");
                    text.push_str(t);
                    parts.push(json!({"type": "text", "text": t}));
                }
                Some("image") if role == "user" => {
                    if let Some(url) = super::image_url_of(blk) {
                        parts.push(json!({"type": "image_url", "image_url": {"url": url?}}));
                    }
                }
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
        let images = parts.iter().any(|p| p["type"] == "image_url");
        let mut msg = match images {
            true => json!({"role": role, "content": parts}),
            false => json!({"role": role, "content": text}),
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::compat::tests::body;

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
}
