//! OpenAI's Responses API (`/v1/responses`, stateless) on the chat engine.

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

/// An OpenAI Responses request as a chat-completions body.
pub(super) fn responses_to_chat(b: &Body) -> Result<Body, ApiError> {
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
                        let content = parts_of(it.get("content").unwrap_or(&Value::Null), "input")?;
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
    use crate::serve::compat::tests::body;

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
}
