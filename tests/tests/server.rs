//! `kiln serve` end to end on SmolLM2 (CPU): the official `openai` Python client, 32
//! concurrent streams against the same requests alone, clients dropped mid-stream, and bad
//! requests. The server runs in-process on a free port; requests go over real TCP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_core::engine::RunnerConfig;
use kiln_core::DType;
use kiln_server::load::{load, ModelArgs};
use kiln_server::serve::{router, state, AppState};
use kiln_tests::{model_file, required, SMOLLM2};
use serde_json::{json, Value};

struct Server {
    addr: SocketAddr,
    state: Arc<AppState>,
    _rt: tokio::runtime::Runtime,
}

fn start(max_batch: usize, api_key: Option<&str>) -> Option<Server> {
    let path = model_file(SMOLLM2)?;
    let args = ModelArgs {
        model: Some(path.display().to_string()),
        backend: "cpu".into(),
        threads: None,
        ctx: Some(512),
        strict: false,
        kv_type: DType::F32,
    };
    let cfg = RunnerConfig {
        max_seqs: max_batch,
        max_batch_tokens: 64,
        // As `kiln serve` runs.
        prefix_caching: true,
        ..RunnerConfig::default()
    };
    let st = state(
        load(&args, cfg).expect("model loads"),
        max_batch,
        api_key.map(String::from),
    )
    .expect("server state");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = router(st.clone());
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Some(Server {
        addr,
        state: st,
        _rt: rt,
    })
}

/// One HTTP/1.1 exchange: (status, body with any chunked encoding removed).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    key: Option<&str>,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n..];
        s = s.strip_prefix("\r\n").unwrap_or(s);
    }
    out
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
    http(addr, "POST", path, body.to_string().as_bytes(), None)
}

/// The text of a streamed completion, from its SSE body (which must end with [DONE]).
fn streamed_text(body: &str) -> String {
    let datas: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(
        datas.last(),
        Some(&"[DONE]"),
        "stream not terminated: {body}"
    );
    datas[..datas.len() - 1]
        .iter()
        .map(|d| {
            let v: Value = serde_json::from_str(d).expect("chunk JSON");
            v["choices"][0]["text"].as_str().unwrap_or("").to_string()
        })
        .collect()
}

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
    let snap = srv.state.engine.snapshot();
    println!("{snap:?}");
    assert_eq!(snap.running, 0);
}

#[test]
fn clients_dropped_mid_stream_leave_the_kv_pool_free() {
    let Some(srv) = start(4, None) else {
        return;
    };
    let free = srv.state.engine.snapshot().kv_free;
    let body = json!({"prompt": "Tell me a long story about", "max_tokens": 400,
                      "temperature": 0, "stream": true})
    .to_string();
    let mut conns = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(srv.addr).expect("connect");
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(head.as_bytes()).expect("write");
        conns.push(s);
    }
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

fn get(addr: SocketAddr, path: &str) -> Value {
    let (st, body) = http(addr, "GET", path, b"", None);
    assert_eq!(st, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// A sample's value in Prometheus text (`name` with its labels, exactly as written).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

fn metrics_text(addr: SocketAddr) -> String {
    let (st, text) = http(addr, "GET", "/metrics", b"", None);
    assert_eq!(st, 200);
    text
}

fn completion(addr: SocketAddr, body: &Value) -> Value {
    let (st, text) = post(addr, "/v1/completions", body);
    assert_eq!(st, 200, "{text}");
    serde_json::from_str(&text).expect("JSON")
}

/// Two requests sharing a long prefix, one after the other: the second's full prefix blocks
/// come from the cache (hits in /metrics) and it computes that many fewer tokens.
#[test]
fn a_shared_prefix_is_served_from_the_cache_with_hits_in_metrics() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let shared = "You are a careful assistant. Answer briefly and precisely, in plain English, \
                  without lists. Keep to the facts you are sure of and say so when unsure. ";
    let ask = |q: &str| {
        json!({"prompt": format!("{shared}Question: {q} Answer:"), "max_tokens": 4,
               "temperature": 0})
    };
    completion(srv.addr, &ask("what is the capital of France?"));
    let before = metrics_text(srv.addr);
    let r = completion(srv.addr, &ask("what is the boiling point of water?"));
    let after = metrics_text(srv.addr);
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let hits = delta("kiln_prefix_cache_hit_tokens_total");
    let computed = delta("kiln_tokens_computed_total");
    let prompt = r["usage"]["prompt_tokens"].as_f64().expect("usage");
    let generated = r["usage"]["completion_tokens"].as_f64().expect("usage");
    println!("prompt {prompt}, generated {generated}, reused {hits}, computed {computed}");
    // The shared text is over 32 tokens: at least two full 16-token blocks are reused.
    assert!(hits >= 32.0, "only {hits} tokens from the cache:\n{after}");
    // Every prompt token and every generated one but the last is fed once, cached or computed.
    assert_eq!(computed + hits, prompt + generated - 1.0);
    assert!(metric(&after, "kiln_prefix_cache_hit_rate") > 0.0);
}

/// /props describes the server; /slots shows a running request with the KV blocks it holds;
/// /metrics has the latency histograms and the outcome and status counters.
#[test]
fn props_slots_and_metrics_describe_the_server() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let props = get(srv.addr, "/props");
    assert_eq!(props["context_length"], 512, "{props}");
    assert_eq!(props["backend"], "cpu", "{props}");
    assert_eq!(props["kv_block_size"], 16, "{props}");
    assert_eq!(props["prefix_caching"], true, "{props}");
    assert!(props["chat_template"].is_string(), "{props}");
    let addr = srv.addr;
    let long = std::thread::spawn(move || {
        completion(
            addr,
            &json!({"prompt": "Tell me a long story about", "max_tokens": 60,
                    "temperature": 0}),
        )
    });
    let t0 = Instant::now();
    let seen = loop {
        let s = get(srv.addr, "/slots");
        if s["slots"].as_array().is_some_and(|v| !v.is_empty()) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no slot appeared");
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("{seen}");
    let slot = &seen["slots"][0];
    assert!(
        matches!(
            slot["state"].as_str(),
            Some("queued" | "prefill" | "decode")
        ),
        "{seen}"
    );
    let r = long.join().expect("client");
    assert_eq!(r["usage"]["completion_tokens"], 60, "{r}");
    let after = get(srv.addr, "/slots");
    assert_eq!(after["slots"], json!([]), "{after}");
    assert_eq!(after["kv_blocks"]["used"], 0, "{after}");
    // While running, the request held blocks for its tokens so far.
    if slot["state"] != "queued" {
        assert!(slot["kv_blocks"].as_u64() > Some(0), "{seen}");
    }
    let _ = post(srv.addr, "/v1/completions", &json!({"prompt": 5}));
    let m = metrics_text(srv.addr);
    assert!(metric(&m, "kiln_time_to_first_token_seconds_count") >= 1.0);
    assert!(metric(&m, "kiln_inter_token_latency_seconds_count") >= 59.0);
    assert!(metric(&m, "kiln_requests_total{status=\"length\"}") >= 1.0);
    assert!(metric(&m, "kiln_http_responses_total{code=\"200\"}") >= 1.0);
    assert_eq!(metric(&m, "kiln_http_responses_total{code=\"400\"}"), 1.0);
    assert!(metric(&m, "kiln_generation_tokens_total") >= 60.0);
}

/// `n` choices: greedy ones all equal the single answer; sampled ones are reproducible with a
/// seed; usage counts every choice.
#[test]
fn n_choices() {
    let Some(srv) = start(4, None) else {
        return;
    };
    let one = completion(
        srv.addr,
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}),
    );
    let three = completion(
        srv.addr,
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                "n": 3}),
    );
    let choices = three["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{three}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], one["choices"][0]["text"], "{three}");
    }
    assert_eq!(three["usage"]["completion_tokens"], 18, "{three}");
    let sampled = json!({"prompt": "My favourite food is", "max_tokens": 8,
                         "temperature": 1.0, "seed": 11, "n": 3});
    let a = completion(srv.addr, &sampled);
    let b = completion(srv.addr, &sampled);
    assert_eq!(
        a["choices"], b["choices"],
        "a seeded request is not reproducible"
    );
    // Streamed: every index appears, each ends once, and the texts are the whole ones.
    let mut body = sampled.clone();
    body["stream"] = json!(true);
    let (st, text) = post(srv.addr, "/v1/completions", &body);
    assert_eq!(st, 200, "{text}");
    let mut texts = vec![String::new(); 3];
    let mut ends = vec![0; 3];
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(d).expect("chunk");
        let c = &v["choices"][0];
        let i = c["index"].as_u64().expect("index") as usize;
        texts[i].push_str(c["text"].as_str().unwrap_or(""));
        ends[i] += usize::from(!c["finish_reason"].is_null());
    }
    assert_eq!(ends, vec![1, 1, 1], "{text}");
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(Some(t.as_str()), a["choices"][i]["text"].as_str());
    }
}

/// Log-probabilities: the first token's against the model's own logits computed separately
/// (a Runner and an f64 log-softmax), greedy tokens are their own top alternative, and the
/// token texts add up to the output.
#[test]
fn logprobs_match_the_model() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let path = model_file(SMOLLM2).expect("model");
    let file = kiln_core::load::gguf::GgufFile::open(&path).expect("model parses");
    let tok = kiln_core::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let prompt = "The capital of France is";
    let ids = tok.encode(prompt, true).expect("encode");
    let ex = kiln_core::backend::Executor::cpu();
    let model = kiln_core::model::build_from_gguf(&file, &ex).expect("model");
    let mut runner =
        kiln_core::engine::Runner::new(ex, model, RunnerConfig::default()).expect("runner");
    let logits = runner
        .feed(1, &ids, kiln_core::engine::Logits::Last)
        .expect("forward")
        .pop()
        .expect("a row");
    let lsm = kiln_core::sample::log_softmax(&logits);

    let r = completion(
        srv.addr,
        &json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3}),
    );
    let c = &r["choices"][0];
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token text"))
        .collect();
    assert_eq!(tokens.len(), 5, "{r}");
    assert_eq!(tokens.concat(), c["text"].as_str().expect("text"), "{r}");
    let first = tok.encode(tokens[0], false).expect("encode");
    let want = lsm[first[0] as usize];
    let got = lp["token_logprobs"][0].as_f64().expect("logprob");
    assert!(
        (got - want).abs() < 1e-3,
        "first token logprob {got} vs {want}"
    );
    for (i, top) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("a map");
        assert_eq!(top.len(), 3, "{r}");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().expect("logprob");
        assert!(
            (best - chosen).abs() < 1e-6,
            "greedy token {i} is not the most likely: {r}"
        );
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .expect("offsets")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{r}");

    // Chat, streamed and not: the same tokens, each greedy token its own best alternative.
    let chat = json!({"messages": [{"role": "user", "content": "Name a colour."}],
                      "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (st, text) = post(srv.addr, "/v1/chat/completions", &chat);
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .clone();
    assert_eq!(content.len(), 6, "{v}");
    for e in &content {
        let top = e["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert!(
            top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(),
            "{e}"
        );
        assert!(e["logprob"].as_f64().is_some_and(|l| l <= 0.0), "{e}");
        assert!(e["bytes"].is_array(), "{e}");
    }
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let (st, text) = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(st, 200, "{text}");
    let streamed: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .flat_map(|v| {
            v["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed, content);
}

/// A client that leaves before a non-streamed answer is complete: the request is cancelled
/// and its blocks return to the pool.
#[test]
fn a_non_streaming_client_that_leaves_is_cancelled() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let free = srv.state.engine.snapshot().kv_free;
    let body = json!({"prompt": "Tell me a long story about", "max_tokens": 400,
                      "temperature": 0})
    .to_string();
    let mut s = TcpStream::connect(srv.addr).expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let t0 = Instant::now();
    while srv.state.engine.snapshot().stats.generated < 3 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(s);
    loop {
        let snap = srv.state.engine.snapshot();
        if snap.slots.is_empty() && snap.kv_free == free {
            assert_eq!(snap.stats.cancelled, 1, "{snap:?}");
            assert!(snap.stats.generated < 400, "{snap:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the request was not cancelled: {snap:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A model whose chat template opens `<think>` on the assistant's turn (the tiny Qwen3.5
/// checkpoint with such a template): the answer arrives as `reasoning_content`, streamed and
/// not, equal to the raw text the completions endpoint gives for the same prompt, and /props
/// reports the syntax. (The parser itself is tested at every split point in
/// core/src/chat/parse.rs; this checks the server's plumbing around it.)
#[test]
fn a_thinking_template_turns_the_output_into_reasoning_content() {
    let src = kiln_tests::fixtures().join("hf").join("qwen3_5");
    let dir = std::env::temp_dir().join(format!("kiln-think-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copy");
    }
    let template = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if tools %}{{ '<tools>' }}{% for t in tools %}{{ t.function.name }}{% endfor %}{{ '</tools> answer with <tool_call>{json}</tool_call>' }}{% endif %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}";
    let cfg = json!({"eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let args = ModelArgs {
        model: Some(dir.display().to_string()),
        backend: "cpu".into(),
        threads: None,
        ctx: Some(256),
        strict: false,
        kv_type: DType::F32,
    };
    let cfg = RunnerConfig {
        max_seqs: 2,
        ..RunnerConfig::default()
    };
    let st = state(load(&args, cfg).expect("loads"), 2, None).expect("state");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = router(st);
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let props = get(addr, "/props");
    assert_eq!(props["reasoning"], true, "{props}");
    assert_eq!(props["tool_calls"], true, "{props}");
    let chat = json!({"messages": [{"role": "user", "content": "Why is the sky blue?"}],
                      "max_tokens": 12, "temperature": 0});
    let (code, body) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"]
        .as_str()
        .expect("reasoning_content")
        .to_string();
    assert!(!reasoning.is_empty(), "{v}");
    assert_eq!(msg["content"], "", "{v}");
    // The same prompt as raw text through the completions endpoint.
    let raw = "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let c = completion(
        addr,
        &json!({"prompt": raw, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(c["choices"][0]["text"].as_str(), Some(reasoning.as_str()));
    // Streamed: reasoning deltas only, adding up to the same text.
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let (code, text) = post(addr, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{text}");
    let mut streamed = String::new();
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(d).expect("chunk");
        let delta = &v["choices"][0]["delta"];
        assert!(
            delta["content"].as_str().is_none_or(str::is_empty),
            "content in a reasoning stream: {d}"
        );
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, reasoning);
    // With tools offered, the template lists them (and a tool call would be parsed).
    let mut with_tools = chat.clone();
    with_tools["tools"] = json!([{"type": "function", "function": {"name": "sky_colour"}}]);
    let (code, body) = post(addr, "/v1/chat/completions", &with_tools);
    assert_eq!(code, 200, "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
