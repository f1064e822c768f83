//! The routes around generation that RAG stacks and tooling call: `/tokenize`, `/detokenize`
//! and `/apply-template` (llama-server's shapes) and `/v1/embeddings` (OpenAI's).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use kiln_core::engine::Pooling;
use serde_json::{json, Value};

use super::request::{body_json, boolean, chat_text, check_model, ApiError, Body};
use super::{body_bytes, AppState};

/// Inputs one `/v1/embeddings` request may hold.
pub const MAX_EMBED_INPUTS: usize = 256;

/// Runs `f` over the request's JSON on a blocking thread. With `admit` (work that renders the
/// chat template or runs the model), it holds an admission slot meanwhile (429 past
/// `--max-concurrent`), and a render is stopped when the client leaves.
async fn blocking_with(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    admit: bool,
    f: fn(&AppState, &Body) -> Result<Value, ApiError>,
) -> Response {
    let bytes = match body_bytes(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let r = if admit {
        super::prepare_blocking(&state, move |st| f(st, &body_json(&bytes)?)).await
    } else {
        tokio::task::spawn_blocking(move || f(&state, &body_json(&bytes)?))
            .await
            .unwrap_or_else(|e| Err(ApiError::internal(format!("the request failed: {e}"))))
    };
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn blocking(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    f: fn(&AppState, &Body) -> Result<Value, ApiError>,
) -> Response {
    blocking_with(state, body, false, f).await
}

async fn admitted(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    f: fn(&AppState, &Body) -> Result<Value, ApiError>,
) -> Response {
    blocking_with(state, body, true, f).await
}

/// A token's text, or its bytes when they are not UTF-8 on their own (a piece of a
/// multi-byte character), as llama-server writes `with_pieces`.
fn piece(state: &AppState, id: u32) -> Value {
    let bytes = state.tokenizer.token_bytes(id).unwrap_or_default();
    match String::from_utf8(bytes) {
        Ok(s) => Value::String(s),
        Err(e) => json!(e.into_bytes()),
    }
}

/// `POST /tokenize {"content": "…", "add_special": false, "with_pieces": false}`:
/// `{"tokens": [ids]}`, or `[{"id": …, "piece": …}]` with pieces.
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    blocking(state, body, |state, b| {
        let content = b
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad("content must be a string", Some("content")))?;
        let add_special = boolean(b, "add_special")?.unwrap_or(false);
        let ids = state
            .tokenizer
            .encode(content, add_special)
            .map_err(|e| ApiError::bad(e.to_string(), Some("content")))?;
        let tokens: Vec<Value> = if boolean(b, "with_pieces")?.unwrap_or(false) {
            ids.iter()
                .map(|&id| json!({"id": id, "piece": piece(state, id)}))
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(json!({ "tokens": tokens }))
    })
    .await
}

/// The token ids of `b[key]`, each in the vocabulary.
fn token_ids(state: &AppState, v: &Value, key: &'static str) -> Result<Vec<u32>, ApiError> {
    let vocab = state.tokenizer.vocab_size();
    let bad = || ApiError::bad(format!("{key} must be a list of token ids"), Some(key));
    let list = v.as_array().ok_or_else(bad)?;
    let mut ids = Vec::with_capacity(list.len());
    for t in list {
        let id = t
            .as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(bad)?;
        if id as usize >= vocab {
            return Err(ApiError::bad(
                format!("token id {id} is outside the vocabulary of {vocab}"),
                Some(key),
            ));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// `POST /detokenize {"tokens": [ids]}`: `{"content": "…"}`.
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    blocking(state, body, |state, b| {
        let ids = token_ids(state, b.get("tokens").unwrap_or(&Value::Null), "tokens")?;
        Ok(json!({ "content": state.tokenizer.decode(&ids) }))
    })
    .await
}

/// `POST /apply-template {"messages": […], "tools": […]}`: `{"prompt": "…"}`, the text a
/// chat request would be tokenized from.
pub async fn apply_template(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    admitted(state, body, |state, b| {
        let (text, _, _, _) = chat_text(state, b)?;
        Ok(json!({ "prompt": text }))
    })
    .await
}

/// Standard base64 (RFC 4648, padded).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The inputs of an embeddings request, tokenized: a string, a list of strings, a list of
/// token ids, or a list of such lists.
fn embed_inputs(state: &AppState, b: &Body) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = || {
        ApiError::bad(
            "input must be a string, a list of strings, a list of token ids or a list of lists of token ids",
            Some("input"),
        )
    };
    let text = |s: &str| {
        state
            .tokenizer
            .encode(s, true)
            .map_err(|e| ApiError::bad(e.to_string(), Some("input")))
    };
    let inputs = match b.get("input") {
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(v)) if v.is_empty() => return Err(bad()),
        Some(Value::Array(v)) if v.iter().all(Value::is_number) => {
            vec![token_ids(state, &Value::Array(v.clone()), "input")?]
        }
        Some(Value::Array(v)) => {
            if v.len() > MAX_EMBED_INPUTS {
                return Err(ApiError::bad(
                    format!("at most {MAX_EMBED_INPUTS} inputs per request"),
                    Some("input"),
                ));
            }
            v.iter()
                .map(|x| match x {
                    Value::String(s) => text(s),
                    Value::Array(_) => token_ids(state, x, "input"),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        _ => return Err(bad()),
    };
    for (i, ids) in inputs.iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::bad(format!("input {i} is empty"), Some("input")));
        }
        if ids.len() >= state.ctx {
            return Err(ApiError {
                status: StatusCode::BAD_REQUEST,
                message: format!(
                    "input {i} has {} tokens; the context holds {}",
                    ids.len(),
                    state.ctx
                ),
                param: Some("input"),
                code: Some("context_length_exceeded"),
            });
        }
    }
    Ok(inputs)
}

/// `POST /v1/embeddings`: each input's final hidden states pooled as the model's config
/// says (`--pooling` overrides; the last token's by default) and normalised to unit length.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    blocking(state, body, |state, b| {
        check_model(state, b)?;
        let base64_out = match b.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(_) => {
                return Err(ApiError::bad(
                    "encoding_format must be \"float\" or \"base64\"",
                    Some("encoding_format"),
                ))
            }
        };
        let width = state.embedding_width;
        match b.get("dimensions") {
            None | Some(Value::Null) => {}
            Some(d) if d.as_u64() == Some(width as u64) => {}
            Some(_) => {
                return Err(ApiError::bad(
                    format!("dimensions: this model's embeddings have {width}"),
                    Some("dimensions"),
                ))
            }
        }
        let inputs = embed_inputs(state, b)?;
        let mut data = Vec::with_capacity(inputs.len());
        let mut tokens = 0;
        for (i, ids) in inputs.into_iter().enumerate() {
            tokens += ids.len();
            let v = state
                .engine
                .embed(ids, state.pooling)
                .recv()
                .map_err(|_| ApiError::internal("the engine has stopped"))?
                .map_err(|e| ApiError::bad(e.to_string(), Some("input")))?;
            let embedding = if base64_out {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64(&bytes))
            } else {
                json!(v)
            };
            data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
        }
        Ok(json!({
            "object": "list",
            "data": data,
            "model": state.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    })
    .await
}

/// The pooling a model's config names: GGUF `{arch}.pooling_type`, or for a Hugging Face
/// directory a sentence-transformers `1_Pooling/config.json`; the last token's otherwise.
pub(super) fn config_pooling(
    path: &std::path::Path,
    file: &kiln_core::load::gguf::GgufFile,
) -> Pooling {
    if let Some(p) = file
        .get_u64(&file.arch_key("pooling_type"))
        .ok()
        .and_then(Pooling::from_gguf_code)
    {
        return p;
    }
    let st: Option<Value> = std::fs::read(path.join("1_Pooling").join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let on = |k: &str| st.as_ref().and_then(|v| v.get(k)?.as_bool()) == Some(true);
    if on("pooling_mode_mean_tokens") {
        Pooling::Mean
    } else if on("pooling_mode_cls_token") {
        Pooling::First
    } else {
        Pooling::Last
    }
}

/// `--cors-origin`: answers preflights and adds the CORS headers for these origins (any
/// with `*`), for GET and POST with whatever headers the page asks to send.
pub(super) fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::Method;
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| axum::http::HeaderValue::from_str(o.trim_end_matches('/')).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            // Mirrored rather than `*`: a wildcard does not cover `Authorization`.
            .allow_headers(AllowHeaders::mirror_request())
            .max_age(std::time::Duration::from_secs(600)),
    )
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc, "{raw}");
        }
    }
}
