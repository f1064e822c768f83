//! `kiln serve` on a block-diffusion model (the tiny DiffusionGemma fixture): completions
//! whole and streamed (committed canvases arrive as they are made), reproducible with a
//! seed, a repeated prompt served from the prefix cache, several requests at once, and a
//! client that leaves mid-stream frees its KV blocks.

#[path = "common/server.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

fn server() -> Server {
    let dir = kiln_tests::fixtures().join("hf").join("diffusion_gemma");
    start_model(&dir, 2, None).expect("a server")
}

#[test]
fn completions_stream_canvases_and_free_the_pool() {
    let srv = server();
    let total = srv.state.engine.snapshot().kv_total;
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 20, "seed": 3});
    let a = completion(srv.addr, &body);
    let b = completion(srv.addr, &body);
    let text = a["choices"][0]["text"].as_str().expect("text").to_string();
    assert_eq!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "the same seed"
    );
    let n = a["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!(n > 0 && n <= 20, "{a}");
    if a["choices"][0]["finish_reason"] == "length" {
        assert_eq!(n, 20, "{a}");
    }
    // Canvases and their denoising steps are counted.
    let m = metrics_text(srv.addr);
    let (canvases, steps) = (
        metric(&m, "kiln_diffusion_canvases_total"),
        metric(&m, "kiln_diffusion_denoising_steps_total"),
    );
    assert!(canvases >= 2.0 * (n as f64 / 8.0).ceil(), "{canvases}");
    assert!(steps >= canvases, "{steps} steps for {canvases} canvases");
    // Streamed: the same text, in more than one piece (canvases of 8).
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (st, raw) = post(srv.addr, "/v1/completions", &sbody);
    assert_eq!(st, 200, "{raw}");
    assert_eq!(streamed_text(&raw), text);
    if n > 8 {
        assert!(raw.matches("data: ").count() >= 3, "{raw}");
    }
    // A repeated long prompt starts from the prefix cache.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(4);
    let body2 = json!({"prompt": long, "max_tokens": 8, "seed": 4});
    let first = completion(srv.addr, &body2);
    let again = completion(srv.addr, &body2);
    let cached = &again["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(cached.as_u64().is_some_and(|n| n >= 16), "{again}");
    assert_eq!(first["choices"][0]["text"], again["choices"][0]["text"]);
    // Chat through the checkpoint's own template.
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12,
                      "seed": 2});
    let (st, raw) = post(srv.addr, "/v1/chat/completions", &chat);
    assert_eq!(st, 200, "{raw}");
    let v: serde_json::Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");
    assert!(
        v["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| n <= 12),
        "{v}"
    );
    // Five at once on a server that holds two in its cache: the rest wait their turn.
    let threads: Vec<_> = (0..5)
        .map(|i| {
            let addr = srv.addr;
            std::thread::spawn(move || {
                let b = json!({"prompt": format!("Story {i}:"), "max_tokens": 16, "seed": i});
                completion(addr, &b)
            })
        })
        .collect();
    let mut most = 0;
    while threads.iter().any(|t| !t.is_finished()) {
        most = most.max(srv.state.engine.snapshot().running);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(most <= 2, "{most} diffusion requests in the cache at once");
    for t in threads {
        let v = t.join().expect("client");
        assert!(v["choices"][0]["text"].is_string(), "{v}");
    }
    // A client that leaves mid-stream: its request is cancelled and its blocks return.
    let long = json!({"prompt": "Once upon a time", "max_tokens": 400, "stream": true, "seed": 1})
        .to_string();
    let mut c = TcpStream::connect(srv.addr).expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}",
        long.len()
    );
    c.write_all(head.as_bytes()).expect("write");
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    while got.matches("data: ").count() < 2 {
        let k = c.read(&mut buf).expect("read");
        assert!(k > 0, "closed early: {got}");
        got.push_str(&String::from_utf8_lossy(&buf[..k]));
    }
    let mid = srv.state.engine.snapshot();
    assert!(mid.running == 1 && mid.kv_free < total, "{mid:?}");
    drop(c);
    let t0 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        if s.running == 0 && s.kv_free == s.kv_total {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "not freed: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
