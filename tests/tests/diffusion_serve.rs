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
use kiln_core::engine::SlotState;
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
    // Two in the cache at once: their canvases shared passes.
    let m = metrics_text(srv.addr);
    let (passes, in_passes) = (
        metric(&m, "kiln_diffusion_passes_total"),
        metric(&m, "kiln_diffusion_pass_canvases_total"),
    );
    assert!(
        in_passes > passes,
        "{in_passes} canvases in {passes} passes"
    );
    // A token-by-token request beside a diffusion one shares its passes (counted); tried a
    // few times, since the two must arrive while the other runs.
    let shared = |m: &str| metric(m, "kiln_diffusion_shared_passes_total");
    let before = shared(&m);
    let ar = json!({"prompt": "Story A:", "max_tokens": 48, "ignore_eos": true,
                    "temperature": 0, "autoregressive": true});
    let dg = json!({"prompt": "Story B:", "max_tokens": 48, "ignore_eos": true, "seed": 9});
    let mut after = before;
    for _ in 0..5 {
        let threads: Vec<_> = [ar.clone(), dg.clone()]
            .into_iter()
            .map(|b| {
                let addr = srv.addr;
                std::thread::spawn(move || completion(addr, &b))
            })
            .collect();
        for t in threads {
            let v = t.join().expect("client");
            assert_eq!(v["usage"]["completion_tokens"], 48, "{v}");
        }
        after = shared(&metrics_text(srv.addr));
        if after > before {
            break;
        }
    }
    assert!(after > before, "no pass held both kinds");
    // A grammar is for token-by-token requests only.
    let g = json!({"prompt": "x", "max_tokens": 4, "grammar": "start: \"a\""});
    let (st, raw) = post(srv.addr, "/v1/completions", &g);
    assert_eq!(st, 400, "{raw}");
    let g = json!({"prompt": "x", "max_tokens": 4, "grammar": "start: \"a\"",
                   "autoregressive": true});
    let (st, raw) = post(srv.addr, "/v1/completions", &g);
    assert_eq!(st, 200, "{raw}");
    let v: serde_json::Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(v["choices"][0]["text"], "a", "{v}");
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
    // /slots lists it (the list is refreshed every SLOTS_EVERY), denoising, with its prompt
    // and the cache it holds.
    let t0 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        let listed = s.slots.iter().any(|s| {
            s.state == SlotState::Denoise
                && s.prompt_tokens > 0
                && s.computed >= s.prompt_tokens
                && s.kv_blocks > 0
        });
        if listed {
            break;
        }
        assert!(
            s.running == 1 && t0.elapsed() < Duration::from_secs(5),
            "{s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
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

/// `stream_drafts`: every denoising step's draft arrives before its canvas's text, numbered
/// canvas by canvas, and the last draft of a canvas is the text committed; usage reports
/// canvases (the one a stop string ends in too), steps per canvas and tokens per second.
/// Asking for drafts without streaming, or from a model that does not denoise, is a 400.
#[test]
fn drafts_stream_step_by_step_and_usage_reports_the_denoising() {
    let srv = server();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 16, "seed": 5,
                      "stream": true, "stream_drafts": true, "ignore_eos": true,
                      "stream_options": {"include_usage": true}});
    let (st, raw) = post(srv.addr, "/v1/completions", &body);
    assert_eq!(st, 200, "{raw}");
    let chunks: Vec<serde_json::Value> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    let usage = chunks
        .iter()
        .find_map(|c| c.get("usage").filter(|u| !u.is_null()))
        .expect("a usage chunk");
    let canvases = usage["canvases"].as_u64().expect("canvases") as usize;
    let steps = usage["denoising_steps"].as_u64().expect("steps") as usize;
    assert_eq!(usage["completion_tokens"], 16, "{usage}");
    assert_eq!(canvases, 2, "two canvases of 8: {usage}");
    let per = usage["steps_per_canvas"]
        .as_f64()
        .expect("steps per canvas");
    assert!((per - steps as f64 / 2.0).abs() < 1e-9, "{usage}");
    assert!(
        usage["tokens_per_second"].as_f64().is_some_and(|t| t > 0.0),
        "{usage}"
    );
    // Drafts in order, steps counted from 1 in each canvas; a canvas's text follows its
    // drafts (before the next canvas's) and is its last draft's.
    let mut drafts: Vec<(u64, u64, String)> = Vec::new();
    let mut texts = vec![String::new(); canvases];
    for c in &chunks {
        let ch = &c["choices"][0];
        if let Some(d) = ch.get("draft") {
            let canvas = d["canvas"].as_u64().expect("canvas");
            let step = d["step"].as_u64().expect("step");
            let want = match drafts.last() {
                Some(&(c0, s0, _)) if c0 == canvas => (canvas, s0 + 1),
                Some(&(c0, _, _)) => (c0 + 1, 1),
                None => (0, 1),
            };
            assert_eq!((canvas, step), want, "{raw}");
            drafts.push((canvas, step, d["text"].as_str().expect("text").into()));
        } else if let Some(t) = ch["text"].as_str().filter(|t| !t.is_empty()) {
            let last = drafts.last().expect("a canvas's text after its drafts");
            texts[last.0 as usize].push_str(t);
        }
    }
    assert_eq!(drafts.len(), steps, "one draft per denoising step");
    let last: String = (0..canvases as u64)
        .map(|c| {
            let d = drafts.iter().filter(|d| d.0 == c).next_back();
            d.expect("a canvas's drafts").2.clone()
        })
        .collect();
    // (A character split between canvases decodes lossily in a draft.)
    if !last.contains('\u{FFFD}') {
        assert_eq!(last, texts.concat(), "{raw}");
    }
    // Without drafts the same seed gives the same text, and no draft chunks.
    let mut plain = body.clone();
    plain["stream_drafts"] = json!(false);
    let (_, raw2) = post(srv.addr, "/v1/completions", &plain);
    assert!(!raw2.contains("\"draft\""), "{raw2}");
    assert_eq!(streamed_text(&raw2), streamed_text(&raw));
    // Drafts need a stream.
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let (st, raw3) = post(srv.addr, "/v1/completions", &whole);
    assert_eq!(st, 400, "{raw3}");
    assert!(raw3.contains("stream_drafts"), "{raw3}");
    // A non-streamed diffusion response reports the denoising too.
    whole["stream_drafts"] = json!(false);
    let v = completion(srv.addr, &whole);
    assert_eq!(v["usage"]["canvases"], 2, "{v}");
    // A stop string inside the first canvas ends the choice there, and that canvas counts.
    let first: Vec<char> = texts[0].chars().collect();
    if first.len() >= 2 && !texts[0].contains('\u{FFFD}') {
        let stop: String = first[first.len() - 2..].iter().collect();
        whole["stop"] = json!([stop]);
        let v = completion(srv.addr, &whole);
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        assert_eq!(v["usage"]["canvases"], 1, "stopped in canvas 0: {v}");
    }
}

#[test]
fn drafts_are_refused_for_a_model_that_does_not_denoise() {
    let dir = kiln_tests::fixtures().join("hf").join("llama");
    let srv = start_model(&dir, 1, None).expect("a server");
    let body = json!({"prompt": "Hi", "max_tokens": 2, "stream": true, "stream_drafts": true});
    let (st, raw) = post(srv.addr, "/v1/completions", &body);
    assert_eq!(st, 400, "{raw}");
    assert!(raw.contains("block-diffusion"), "{raw}");
}
