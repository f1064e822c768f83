//! `/v1/embeddings`, `/tokenize`, `/detokenize`, `/apply-template` and `--cors-origin` over
//! real TCP. Embeddings are checked against transformers: the tiny Llama fixture's reference
//! logits are its final hidden states times `lm_head`, so least squares recovers each
//! position's hidden state (the head is 320 × 64) from transformers' own numbers.

#[path = "common/server.rs"]
mod common;

use std::path::Path;

use common::*;
use kiln_core::engine::Pooling;
use kiln_core::engine::RunnerConfig;
use kiln_server::serve::{state_with, ServeOptions};
use kiln_tests::fixtures;
use serde_json::{json, Value};

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// An F32 tensor of a safetensors file: (shape, values).
fn tensor(path: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    let raw = std::fs::read(path).expect("safetensors");
    let n = u64::from_le_bytes(raw[..8].try_into().expect("header length")) as usize;
    let h: Value = serde_json::from_slice(&raw[8..8 + n]).expect("header");
    let t = &h[name];
    assert_eq!(t["dtype"], "F32", "{name}");
    let shape: Vec<usize> = t["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect();
    let o = t["data_offsets"].as_array().expect("offsets");
    let (a, b) = (
        o[0].as_u64().unwrap() as usize,
        o[1].as_u64().unwrap() as usize,
    );
    (shape, f32s(&raw[8 + n + a..8 + n + b]))
}

/// `x` minimising |W x − l| (W is rows × cols, rows > cols), in f64 by the normal equations.
fn least_squares(w: &[f32], rows: usize, cols: usize, l: &[f32]) -> Vec<f64> {
    let mut a = vec![0f64; cols * (cols + 1)];
    for i in 0..cols {
        for j in 0..cols {
            a[i * (cols + 1) + j] = (0..rows)
                .map(|r| w[r * cols + i] as f64 * w[r * cols + j] as f64)
                .sum();
        }
        a[i * (cols + 1) + cols] = (0..rows)
            .map(|r| w[r * cols + i] as f64 * l[r] as f64)
            .sum();
    }
    // Gauss–Jordan with partial pivoting.
    let w1 = cols + 1;
    for c in 0..cols {
        let p = (c..cols)
            .max_by(|&x, &y| a[x * w1 + c].abs().total_cmp(&a[y * w1 + c].abs()))
            .unwrap();
        for k in 0..w1 {
            a.swap(c * w1 + k, p * w1 + k);
        }
        let d = a[c * w1 + c];
        for k in 0..w1 {
            a[c * w1 + k] /= d;
        }
        for r in 0..cols {
            if r != c {
                let f = a[r * w1 + c];
                for k in 0..w1 {
                    a[r * w1 + k] -= f * a[c * w1 + k];
                }
            }
        }
    }
    (0..cols).map(|i| a[i * w1 + cols]).collect()
}

fn unit(v: &[f64]) -> Vec<f64> {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| x / n).collect()
}

fn serve_fixture(dir: &Path, pooling: Option<Pooling>, cors: &[&str]) -> Server {
    let m = load_model(dir, 256, RunnerConfig::default());
    let st = state_with(
        m,
        ServeOptions {
            pooling,
            cors_origins: cors.iter().map(|s| s.to_string()).collect(),
            ..ServeOptions::new(2)
        },
    )
    .expect("state");
    serve(st)
}

fn embeddings(addr: std::net::SocketAddr, body: &Value) -> Vec<Vec<f64>> {
    let (code, text) = post(addr, "/v1/embeddings", body);
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["object"], "list");
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            d["embedding"]
                .as_array()
                .expect("floats")
                .iter()
                .map(|x| x.as_f64().expect("float"))
                .collect()
        })
        .collect()
}

#[test]
fn embeddings_match_transformers_hidden_states() {
    let dir = fixtures().join("hf").join("llama");
    let reference: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).expect("reference"))
            .expect("JSON");
    let tokens: Vec<u64> = reference["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id"))
        .collect();
    let logits = f32s(&std::fs::read(dir.join("logits.f32")).expect("logits"));
    let (shape, head) = tensor(&dir.join("model.safetensors"), "lm_head.weight");
    let (vocab, hidden) = (shape[0], shape[1]);
    let hidden_at = |pos: usize| {
        least_squares(
            &head,
            vocab,
            hidden,
            &logits[pos * vocab..(pos + 1) * vocab],
        )
    };
    let close = |got: &[f64], want: &[f64], what: &str| {
        assert_eq!(got.len(), want.len(), "{what}");
        assert!(
            got.iter().chain(want).all(|x| x.is_finite()),
            "{what}: not finite"
        );
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-5, "{what}: max |difference| {err}");
        eprintln!("{what}: max |difference| {err:.2e}");
    };
    let cuts = [7usize, 20, tokens.len()];
    let inputs: Vec<&[u64]> = cuts.iter().map(|&n| &tokens[..n]).collect();

    let last = serve_fixture(&dir, None, &[]);
    let got = embeddings(last.addr, &json!({ "input": inputs }));
    for (n, e) in cuts.iter().zip(&got) {
        close(e, &unit(&hidden_at(n - 1)), &format!("last of {n}"));
    }
    // Base64: the same floats, little-endian.
    let (code, text) = post(
        last.addr,
        "/v1/embeddings",
        &json!({"input": inputs[0], "encoding_format": "base64"}),
    );
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let b64 = v["data"][0]["embedding"].as_str().expect("base64 text");
    assert_eq!(b64.len(), (hidden * 4).div_ceil(3) * 4);
    drop(last);

    let mean = serve_fixture(&dir, Some(Pooling::Mean), &[]);
    let got = embeddings(mean.addr, &json!({ "input": inputs }));
    for (n, e) in cuts.iter().zip(&got) {
        let mut sum = vec![0f64; hidden];
        for p in 0..*n {
            for (s, x) in sum.iter_mut().zip(hidden_at(p)) {
                *s += x;
            }
        }
        close(e, &unit(&sum), &format!("mean of {n}"));
    }
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [1, 99999]}), "input"),
        (json!({"input": 5}), "input"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
    ] {
        let (code, text) = post(mean.addr, "/v1/embeddings", &body);
        assert_eq!(code, 400, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["error"]["param"], param, "{body}: {text}");
    }
}

#[test]
fn tokenize_detokenize_and_apply_template_agree_with_generation() {
    let Some(srv) = start(1, None) else {
        return;
    };
    let text = "Héllo wörld, 1234 — ünïcode 🙂 and\ttabs";
    let (code, body) = post(
        srv.addr,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    );
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    let pieces = v["tokens"].as_array().expect("tokens");
    let ids: Vec<u64> = pieces
        .iter()
        .map(|p| p["id"].as_u64().expect("id"))
        .collect();
    // Pieces are text, or bytes for part of a character; together they are the text.
    let mut bytes = Vec::new();
    for p in pieces {
        match &p["piece"] {
            Value::String(s) => bytes.extend_from_slice(s.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().expect("byte") as u8)),
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).expect("UTF-8"), text);
    let (code, body) = post(srv.addr, "/detokenize", &json!({ "tokens": ids }));
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON")["content"],
        text
    );
    // The plain form and add_special.
    let (_, plain) = post(srv.addr, "/tokenize", &json!({"content": text}));
    let plain: Value = serde_json::from_str(&plain).expect("JSON");
    assert_eq!(plain["tokens"], json!(ids));

    // apply-template renders what a chat request is tokenized from: its prompt_tokens.
    let messages = json!([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "What is 2 + 2?"}]);
    let (code, body) = post(
        srv.addr,
        "/apply-template",
        &json!({ "messages": messages }),
    );
    assert_eq!(code, 200, "{body}");
    let prompt = serde_json::from_str::<Value>(&body).expect("JSON")["prompt"]
        .as_str()
        .expect("prompt")
        .to_string();
    assert!(prompt.contains("What is 2 + 2?"), "{prompt}");
    let (_, t) = post(srv.addr, "/tokenize", &json!({ "content": prompt }));
    let n = serde_json::from_str::<Value>(&t).expect("JSON")["tokens"]
        .as_array()
        .expect("tokens")
        .len();
    let (code, body) = post(
        srv.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1}),
    );
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["usage"]["prompt_tokens"], n, "{prompt:?}");

    for (path, body, param) in [
        ("/tokenize", json!({"content": 5}), "content"),
        ("/detokenize", json!({"tokens": [1, -2]}), "tokens"),
        ("/detokenize", json!({"tokens": [10_000_000]}), "tokens"),
        ("/apply-template", json!({"messages": []}), "messages"),
    ] {
        let (code, text) = post(srv.addr, path, &body);
        assert_eq!(code, 400, "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["error"]["param"], param, "{path} {body}: {text}");
    }
}

fn preflight(addr: std::net::SocketAddr, origin: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\n\
         Access-Control-Request-Method: POST\r\n\
         Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).expect("read");
    out.to_ascii_lowercase()
}

#[test]
fn cors_is_off_by_default_and_answers_only_the_origins_named() {
    let dir = fixtures().join("hf").join("llama");
    let off = serve_fixture(&dir, None, &[]);
    let r = preflight(off.addr, "http://app.example");
    assert!(!r.contains("access-control-allow-origin"), "{r}");
    drop(off);
    let on = serve_fixture(&dir, None, &["http://app.example"]);
    let r = preflight(on.addr, "http://app.example");
    assert!(r.starts_with("http/1.1 200"), "{r}");
    assert!(
        r.contains("access-control-allow-origin: http://app.example"),
        "{r}"
    );
    assert!(r.contains("authorization"), "{r}");
    let r = preflight(on.addr, "http://other.example");
    assert!(!r.contains("access-control-allow-origin"), "{r}");
    // A real request from the named origin gets the header too.
    let (code, _) = post(on.addr, "/tokenize", &json!({"content": "hi"}));
    assert_eq!(code, 200);
}
