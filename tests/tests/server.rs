//! `kiln serve` end to end on SmolLM2 (CPU): the official `openai` Python client, 32
//! concurrent streams against the same requests alone, clients dropped mid-stream, bad
//! requests, the API key on every route and the loopback guard. The server runs in-process
//! on a free port; requests go over real TCP. (`server_features.rs` has the rest of the API:
//! prefix caching, /props, /slots, /metrics, `n`, log-probabilities, reasoning;
//! `server_limits.rs` load, stalls, timeouts and dropped clients.)

#[path = "common/server.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use kiln_tests::required;
use serde_json::{json, Value};

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "List three colours:",
    "Water boils at",
    "The quick brown fox",
    "In 1969, astronauts",
    "My favourite food is",
];

#[test]
fn thirty_two_concurrent_streams_each_equal_the_request_alone() {
    let Some(srv) = start(32, None) else {
        return;
    };
    let req = |p: &str, stream: bool| json!({"prompt": p, "max_tokens": 10, "temperature": 0, "stream": stream});
    let alone: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let (st, body) = post(srv.addr, "/v1/completions", &req(p, false));
            assert_eq!(st, 200, "{body}");
            let v: Value = serde_json::from_str(&body).expect("JSON");
            v["choices"][0]["text"].as_str().expect("text").to_string()
        })
        .collect();
    let addr = srv.addr;
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let p = PROMPTS[i % PROMPTS.len()];
            let body = req(p, true);
            std::thread::spawn(move || post(addr, "/v1/completions", &body))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (st, body) = t.join().expect("client thread");
        assert_eq!(st, 200, "{body}");
        assert_eq!(
            streamed_text(&body),
            alone[i % PROMPTS.len()],
            "stream {i} differs from the request alone"
        );
    }
    // The engine publishes its snapshot after the step that ended the last request.
    let t0 = Instant::now();
    let snap = loop {
        let snap = srv.state.engine.snapshot();
        if snap.running == 0 || t0.elapsed() > Duration::from_secs(10) {
            break snap;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    println!("{snap:?}");
    assert_eq!(snap.running, 0);
}

/// The server on a quantized cache (K q8_0, V tq3) with prefix caching: concurrent streams
/// equal each request alone, a repeated prompt comes from the cache with the same text,
/// `/props` reports the cache, and the pool is free at the end.
#[test]
fn a_q8_0_k_tq3_v_cache_serves_with_prefix_caching() {
    let Some(path) = kiln_tests::model_file(kiln_tests::SMOLLM2) else {
        return;
    };
    let srv = start_with(&path, 8, None, |a| {
        a.kv_type_k = Some(kiln_core::DType::Q8_0);
        a.kv_type_v = Some(kiln_core::DType::TQ3);
    })
    .expect("server");
    let props = get(srv.addr, "/props");
    assert_eq!(props["kv_cache_type_k"], "q8_0", "{props}");
    assert_eq!(props["kv_cache_type_v"], "tq3", "{props}");
    // 30 layers x 3 heads of 64: two blocks each, 2 x 34 bytes of q8_0 K and 2 x 14 of tq3 V.
    assert_eq!(props["kv_bytes_per_token"], 30 * 3 * (68 + 28), "{props}");
    assert_eq!(props["prefix_caching"], true);
    let free = srv.state.engine.snapshot().kv_free;
    let req = |p: &str, stream: bool| json!({"prompt": p, "max_tokens": 12, "temperature": 0, "stream": stream});
    let alone: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            completion(srv.addr, &req(p, false))["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_string()
        })
        .collect();
    let addr = srv.addr;
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let body = req(PROMPTS[i % PROMPTS.len()], true);
            std::thread::spawn(move || post(addr, "/v1/completions", &body))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (st, body) = t.join().expect("client thread");
        assert_eq!(st, 200, "{body}");
        assert_eq!(streamed_text(&body), alone[i % PROMPTS.len()], "stream {i}");
    }
    // A long prompt twice: the second time its full blocks come from the cache.
    let long = "The history of the city begins with a small settlement on the river, where \
                traders met to exchange salt, grain and cloth. Over the centuries it grew into \
                a market town, then a port, and finally the capital of the region. Its";
    let first = completion(srv.addr, &req(long, false));
    let again = completion(srv.addr, &req(long, false));
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached >= 32, "only {cached} cached tokens: {again}");
    assert_eq!(first["choices"][0]["text"], again["choices"][0]["text"]);
    let t0 = Instant::now();
    while srv.state.engine.snapshot().running > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Freed blocks stay in the prefix cache but count as free.
    assert_eq!(srv.state.engine.snapshot().kv_free, free);
}

#[test]
fn clients_dropped_mid_stream_leave_the_kv_pool_free() {
    let Some(srv) = start(4, None) else {
        return;
    };
    let free = srv.state.engine.snapshot().kv_free;
    let mut conns = long_streams(srv.addr, 4);
    // Read until each stream has sent a few chunks.
    for s in &mut conns {
        let mut got = String::new();
        let mut buf = [0u8; 4096];
        while got.matches("data: ").count() < 3 {
            let n = s.read(&mut buf).expect("read");
            assert!(n > 0, "stream closed early: {got}");
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    let mid = srv.state.engine.snapshot();
    assert!(mid.kv_free < free && mid.running > 0, "{mid:?}");
    drop(conns);
    let t0 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        if s.running == 0 && s.waiting == 0 && s.kv_free == free {
            assert_eq!(s.stats.cancelled, 4, "{s:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "blocks still held: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, metrics) = http(srv.addr, "GET", "/metrics", b"", None);
    assert_eq!(st, 200);
    assert!(
        metrics.contains(&format!("kiln_kv_blocks_free {free}")),
        "{metrics}"
    );
}

#[test]
fn bad_requests_get_openai_style_errors() {
    let Some(srv) = start(2, Some("sk-kiln")) else {
        return;
    };
    let key = Some("sk-kiln");
    let long = "word ".repeat(2000);
    let big = vec![b'x'; kiln_server::serve::MAX_BODY + 10];
    let cases: Vec<(&str, &str, Vec<u8>, Option<&str>, u16, Option<&str>)> = vec![
        (
            "no key",
            "/v1/completions",
            br#"{"prompt":"x"}"#.to_vec(),
            None,
            401,
            None,
        ),
        (
            "wrong key",
            "/v1/models",
            Vec::new(),
            Some("sk-other"),
            401,
            None,
        ),
        (
            "invalid JSON",
            "/v1/completions",
            b"{not json".to_vec(),
            key,
            400,
            None,
        ),
        (
            "not an object",
            "/v1/completions",
            b"[1,2]".to_vec(),
            key,
            400,
            None,
        ),
        (
            "prompt of the wrong type",
            "/v1/completions",
            br#"{"prompt":5}"#.to_vec(),
            key,
            400,
            Some("prompt"),
        ),
        (
            "temperature out of range",
            "/v1/completions",
            br#"{"prompt":"x","temperature":3}"#.to_vec(),
            key,
            400,
            Some("temperature"),
        ),
        (
            "max_tokens of the wrong type",
            "/v1/completions",
            br#"{"prompt":"x","max_tokens":"many"}"#.to_vec(),
            key,
            400,
            Some("max_tokens"),
        ),
        (
            "top_p out of range",
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":"hi"}],"top_p":1.5}"#.to_vec(),
            key,
            400,
            Some("top_p"),
        ),
        (
            "unknown model",
            "/v1/completions",
            br#"{"model":"gpt-9","prompt":"x"}"#.to_vec(),
            key,
            404,
            Some("model"),
        ),
        (
            "no messages",
            "/v1/chat/completions",
            br#"{"messages":[]}"#.to_vec(),
            key,
            400,
            Some("messages"),
        ),
        (
            "unknown role",
            "/v1/chat/completions",
            br#"{"messages":[{"role":"wizard","content":"hi"}]}"#.to_vec(),
            key,
            400,
            Some("messages"),
        ),
        (
            "token outside the vocabulary",
            "/v1/completions",
            br#"{"prompt":[1,99999999]}"#.to_vec(),
            key,
            400,
            Some("prompt"),
        ),
        (
            "prompt longer than the context",
            "/v1/completions",
            json!({"prompt": long}).to_string().into_bytes(),
            key,
            400,
            Some("prompt"),
        ),
        (
            "n out of range",
            "/v1/completions",
            br#"{"prompt":"x","n":17}"#.to_vec(),
            key,
            400,
            Some("n"),
        ),
        (
            "completions logprobs over 5",
            "/v1/completions",
            br#"{"prompt":"x","logprobs":9}"#.to_vec(),
            key,
            400,
            Some("logprobs"),
        ),
        (
            "top_logprobs without logprobs",
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}"#.to_vec(),
            key,
            400,
            Some("top_logprobs"),
        ),
        (
            "top_logprobs over 20",
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}"#
                .to_vec(),
            key,
            400,
            Some("top_logprobs"),
        ),
        (
            "a tool that is not a function",
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web"}]}"#.to_vec(),
            key,
            400,
            Some("tools"),
        ),
        (
            "a forced tool choice",
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":"hi"}],"tool_choice":"required"}"#.to_vec(),
            key,
            400,
            Some("tool_choice"),
        ),
        (
            "stream_options of the wrong type",
            "/v1/completions",
            br#"{"prompt":"x","stream":true,"stream_options":true}"#.to_vec(),
            key,
            400,
            Some("stream_options"),
        ),
        (
            "body over the size limit",
            "/v1/completions",
            big,
            key,
            413,
            None,
        ),
    ];
    for (what, path, body, k, want, param) in cases {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let (st, text) = http(srv.addr, method, path, &body, k);
        assert_eq!(st, want, "{what}: {text}");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
        let err = &v["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {text}"
        );
        assert!(err["type"].is_string(), "{what}: {text}");
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{what}: {text}");
        }
    }
    // The server still serves after all that.
    let (st, text) = http(
        srv.addr,
        "POST",
        "/v1/completions",
        br#"{"prompt":"Hi","max_tokens":2}"#,
        key,
    );
    assert_eq!(st, 200, "{text}");
}

/// A raw HTTP/1.1 request with these headers: (status, body).
fn raw(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).expect("write");
    read_response(&mut s)
}

/// A keyless server on loopback answers only requests addressed to a loopback host (DNS
/// rebinding) and only JSON bodies (a browser's form posts need no preflight).
#[test]
fn a_keyless_loopback_server_refuses_other_hosts_and_non_json_bodies() {
    let Some(loaded) = smollm2(256, kiln_core::engine::RunnerConfig::default()) else {
        return;
    };
    let opts = kiln_server::serve::ServeOptions {
        loopback_only: true,
        ..kiln_server::serve::ServeOptions::new(1)
    };
    let srv = serve(kiln_server::serve::state_with(loaded, opts).expect("server state"));
    let body = r#"{"prompt":"Hi","max_tokens":1}"#;
    let json = "Content-Type: application/json";
    for host in ["localhost", "127.0.0.1:8080", "[::1]:80"] {
        let h = format!("Host: {host}");
        let (st, text) = raw(srv.addr, "POST", "/v1/completions", &[&h, json], body);
        assert_eq!(st, 200, "{host}: {text}");
    }
    for host in [
        "evil.example",
        "evil.example:8080",
        "localhost.evil.example",
    ] {
        let h = format!("Host: {host}");
        let (st, text) = raw(srv.addr, "GET", "/v1/models", &[&h], "");
        assert_eq!(st, 403, "{host}: {text}");
        assert!(text.contains("error"), "{text}");
    }
    for ct in [
        "Content-Type: text/plain",
        "Content-Type: application/x-www-form-urlencoded",
    ] {
        let (st, text) = raw(
            srv.addr,
            "POST",
            "/v1/completions",
            &["Host: localhost", ct],
            body,
        );
        assert_eq!(st, 415, "{ct}: {text}");
    }
    let (st, _) = raw(
        srv.addr,
        "POST",
        "/v1/completions",
        &["Host: localhost"],
        body,
    );
    assert_eq!(st, 415, "no content type");
}

/// One GET with a raw `Authorization` header value: (status, body).
fn get_with_auth(addr: std::net::SocketAddr, path: &str, auth: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\nAuthorization: {auth}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("write");
    read_response(&mut s)
}

/// With a key set, every route but /health needs it (unknown routes too); the scheme is
/// case-insensitive; 404 and 405 are JSON errors; `--public-metrics` opens /metrics alone.
#[test]
fn every_route_but_health_needs_the_key() {
    let Some(srv) = start(1, Some("sk-kiln")) else {
        return;
    };
    let key = Some("sk-kiln");
    let json_error = |what: &str, text: &str| {
        let v: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
        assert!(v["error"]["message"].is_string(), "{what}: {text}");
    };
    for path in [
        "/v1/models",
        "/props",
        "/slots",
        "/metrics",
        "/no/such/route",
    ] {
        let (st, text) = http(srv.addr, "GET", path, b"", None);
        assert_eq!(st, 401, "{path} without the key: {text}");
        json_error(path, &text);
        let (st, text) = http(srv.addr, "GET", path, b"", key);
        let want = if path.starts_with("/no") { 404 } else { 200 };
        assert_eq!(st, want, "{path} with the key: {text}");
        if want == 404 {
            json_error(path, &text);
        }
    }
    let (st, _) = http(srv.addr, "GET", "/health", b"", None);
    assert_eq!(st, 200);
    for auth in ["bearer sk-kiln", "BEARER  sk-kiln", "Bearer sk-kiln"] {
        let (st, text) = get_with_auth(srv.addr, "/v1/models", auth);
        assert_eq!(st, 200, "{auth:?}: {text}");
    }
    for auth in ["Basic sk-kiln", "sk-kiln", "Bearer sk-kil", "Bearersk-kiln"] {
        let (st, _) = get_with_auth(srv.addr, "/v1/models", auth);
        assert_eq!(st, 401, "{auth:?}");
    }
    let (st, text) = http(srv.addr, "POST", "/v1/models", b"{}", key);
    assert_eq!(st, 405, "{text}");
    json_error("POST /v1/models", &text);

    // --public-metrics: /metrics answers without the key, nothing else does.
    let Some(loaded) = smollm2(256, kiln_core::engine::RunnerConfig::default()) else {
        return;
    };
    let opts = kiln_server::serve::ServeOptions {
        api_key: Some("sk-kiln".into()),
        public_metrics: true,
        ..kiln_server::serve::ServeOptions::new(1)
    };
    let st = kiln_server::serve::state_with(loaded, opts).expect("server state");
    let open = serve(st);
    assert_eq!(http(open.addr, "GET", "/metrics", b"", None).0, 200);
    assert_eq!(http(open.addr, "GET", "/props", b"", None).0, 401);
}

/// The official `openai` Python package against the server: chat, streamed chat, completions.
#[test]
fn the_openai_python_client_drives_kiln_serve() {
    let pypath = std::env::var("KILN_TEST_PYTHONPATH").unwrap_or_default();
    let have = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .env("PYTHONPATH", &pypath)
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            !required("OPENAI"),
            "KILN_REQUIRE_OPENAI is set but python3 cannot import openai (PYTHONPATH={pypath:?})"
        );
        println!(
            "skipping: python3 cannot import openai (pip install openai; KILN_TEST_PYTHONPATH)"
        );
        return;
    }
    let Some(srv) = start(4, Some("sk-kiln")) else {
        return;
    };
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="sk-kiln")
model = c.models.list().data[0].id
r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=12, temperature=0)
text = r.choices[0].message.content
assert r.choices[0].message.role == "assistant" and text, r
assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, r.usage
parts = []
for ch in c.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=12, temperature=0, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        parts.append(ch.choices[0].delta.content)
assert "".join(parts) == text, ("".join(parts), text)
cp = c.completions.create(model=model, prompt="The capital of France is", max_tokens=6, temperature=0)
assert cp.choices[0].text and cp.usage.total_tokens == cp.usage.prompt_tokens + cp.usage.completion_tokens, cp
try:
    c.completions.create(model=model, prompt="x", temperature=9)
    raise SystemExit("a bad temperature was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
two = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=5, temperature=0, n=2, logprobs=True, top_logprobs=2)
assert len(two.choices) == 2 and two.choices[0].message.content == two.choices[1].message.content, two
assert two.usage.completion_tokens == 2 * len(two.choices[0].logprobs.content), two
assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in two.choices[0].logprobs.content), two
usage = None
for ch in c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True}):
    if ch.usage:
        usage = ch.usage
assert usage and usage.completion_tokens > 0 and usage.prompt_tokens > 0, usage
weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
r = c.chat.completions.create(model=model, tools=[weather], max_tokens=4, temperature=0, messages=[
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}])
assert r.choices[0].finish_reason in ("stop", "length"), r
lp = c.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0, logprobs=2)
assert "".join(lp.choices[0].logprobs.tokens) == lp.choices[0].text, lp
print("chat:", repr(text))
print("completion:", repr(cp.choices[0].text))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &format!("http://{}/v1", srv.addr)])
        .env("PYTHONPATH", &pypath)
        .output()
        .expect("python3 runs");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "openai client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
