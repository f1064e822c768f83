//! `kiln serve` end to end on SmolLM2 (CPU): the official `openai` Python client, 32
//! concurrent streams against the same requests alone, clients dropped mid-stream, and bad
//! requests. The server runs in-process on a free port; requests go over real TCP.
//! (`server_features.rs` has the rest of the API: prefix caching, /props, /slots, /metrics,
//! `n`, log-probabilities, reasoning.)

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

/// 500 requests at once against a queue of 64: each gets its completion or a 429 (an
/// OpenAI-style rate-limit error), never a 5xx or a hang; the pool is free afterwards.
#[test]
fn a_burst_past_the_queue_limit_gets_429s_and_nothing_worse() {
    let cfg = kiln_core::engine::RunnerConfig {
        max_seqs: 2,
        max_batch_tokens: 64,
        prefix_caching: true,
        ..kiln_core::engine::RunnerConfig::default()
    };
    let Some(loaded) = smollm2(256, cfg) else {
        return;
    };
    let opts = kiln_server::serve::ServeOptions {
        max_queue: 64,
        ..kiln_server::serve::ServeOptions::new(2)
    };
    let srv = serve(kiln_server::serve::state_with(loaded, opts).expect("server state"));
    // All 500 connections first (a storm of simultaneous connects overflows the kernel's
    // accept queue and tests the kernel, not kiln), then all requests at once.
    let conns: Vec<TcpStream> = (0..500)
        .map(|_| TcpStream::connect(srv.addr).expect("connect"))
        .collect();
    let t0 = Instant::now();
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("Request {i}: the capital of France is"),
                                  "max_tokens": 3, "temperature": 0})
                .to_string();
                let req = format!(
                    "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                c.write_all(req.as_bytes()).expect("write");
                read_response(&mut c)
            })
        })
        .collect();
    let mut counts = std::collections::BTreeMap::new();
    for t in threads {
        let (st, text) = t.join().expect("client thread");
        *counts.entry(st).or_insert(0) += 1;
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{st}: {e}: {text}"));
        match st {
            200 => assert!(v["choices"][0]["text"].is_string(), "{text}"),
            429 => assert_eq!(v["error"]["type"], "rate_limit_error", "{text}"),
            _ => panic!("status {st}: {text}"),
        }
    }
    println!("{counts:?} in {:.1} s", t0.elapsed().as_secs_f64());
    assert!(counts.get(&200).copied().unwrap_or(0) >= 66, "{counts:?}");
    assert!(counts.get(&429).copied().unwrap_or(0) > 0, "{counts:?}");
    let s = srv.state.engine.snapshot();
    assert_eq!((s.running, s.waiting), (0, 0), "{s:?}");
    assert_eq!(s.kv_free, s.kv_total, "{s:?}");
}

/// Tokenizing runs off the async workers: while 16 clients send prompts of almost 1 MiB,
/// /health answers in well under 100 ms.
#[test]
fn health_answers_quickly_while_huge_prompts_are_tokenized() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let addr = srv.addr;
    let words = "lorem ipsum dolor sit amet, consectetur adipiscing elit ";
    let prompt = words.repeat((kiln_server::serve::MAX_BODY - 4096) / words.len());
    let body = json!({"prompt": prompt, "max_tokens": 1}).to_string();
    let body = std::sync::Arc::new(body);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (body, done) = (body.clone(), done.clone());
            std::thread::spawn(move || {
                let (st, text) = http(addr, "POST", "/v1/completions", body.as_bytes(), None);
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                (st, text)
            })
        })
        .collect();
    // Let the uploads land and the tokenizers start.
    std::thread::sleep(Duration::from_millis(300));
    let mut worst = Duration::ZERO;
    let mut probes = 0;
    while done.load(std::sync::atomic::Ordering::SeqCst) < 16 && probes < 40 {
        let t0 = Instant::now();
        let (st, _) = http(addr, "GET", "/health", b"", None);
        worst = worst.max(t0.elapsed());
        assert_eq!(st, 200);
        probes += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in clients {
        let (st, text) = c.join().expect("client");
        // Far longer than the context: refused, after tokenizing.
        assert_eq!(st, 400, "{}", &text[..text.len().min(300)]);
        assert!(text.contains("context"), "{}", &text[..text.len().min(300)]);
    }
    println!("{probes} /health probes while tokenizing; the slowest took {worst:?}");
    assert!(
        probes >= 3,
        "the prompts were tokenized before /health was asked"
    );
    assert!(worst < Duration::from_millis(100), "/health took {worst:?}");
}

/// 32 streaming clients that never read (and small socket buffers on both sides, so their
/// output backs up into the server quickly): a fresh client still gets its completion at
/// once, and the stalled ones are dropped after the stall timeout with their KV freed.
#[test]
fn stalled_streams_are_dropped_and_others_keep_going() {
    use socket2::{Domain, Socket, Type};
    let path = kiln_tests::fixtures().join("hf/qwen3_5");
    let cfg = kiln_core::engine::RunnerConfig {
        max_seqs: 40,
        max_batch_tokens: 256,
        prefix_caching: true,
        ..kiln_core::engine::RunnerConfig::default()
    };
    let loaded = load_model(&path, 1024, cfg);
    let opts = kiln_server::serve::ServeOptions {
        stall_timeout: Duration::from_secs(2),
        ..kiln_server::serve::ServeOptions::new(40)
    };
    let st = kiln_server::serve::state_with(loaded, opts).expect("server state");
    // The server's sockets get a small send buffer (no autotuning up to megabytes).
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    sock.set_send_buffer_size(4096).expect("SO_SNDBUF");
    sock.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .expect("addr")
            .into(),
    )
    .expect("bind");
    sock.listen(128).expect("listen");
    let srv = serve_on(st, sock.into());
    let body = json!({"prompt": "Once upon a time", "max_tokens": 900, "stream": true,
                      "temperature": 0, "ignore_eos": true})
    .to_string();
    let stalled: Vec<Socket> = (0..32)
        .map(|_| {
            let c = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
            c.set_recv_buffer_size(4096).expect("SO_RCVBUF");
            c.connect(&srv.addr.into()).expect("connect");
            let req = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut w: &Socket = &c;
            w.write_all(req.as_bytes()).expect("send");
            c
        })
        .collect();
    // Let them start and back up.
    std::thread::sleep(Duration::from_millis(700));
    let t0 = Instant::now();
    let r = completion(
        srv.addr,
        &json!({"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}),
    );
    let fresh = t0.elapsed();
    assert!(r["choices"][0]["text"].is_string(), "{r}");
    println!("a fresh completion beside 32 stalled streams took {fresh:?}");
    assert!(
        fresh < Duration::from_secs(2),
        "the fresh client waited {fresh:?}"
    );
    // The stalled ones are dropped after 2 s without reading; their KV comes back.
    let t1 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        let m = metrics_text(srv.addr);
        let dropped = m
            .lines()
            .find_map(|l| l.strip_prefix("kiln_requests_total{status=\"stalled\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if dropped == 32.0 && s.running == 0 && s.waiting == 0 && s.kv_free == s.kv_total {
            assert!(s.slots.is_empty(), "{:?}", s.slots);
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "stalled streams not dropped: {dropped} of 32, {s:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(stalled);
}

/// A model that panics on one token and stalls on another (a bug in a kernel, a hung device).
struct Faulty {
    inner: Box<dyn kiln_core::model::Model>,
}

const PANICS: u32 = 300;
const STALLS: u32 = 301;

impl kiln_core::model::Model for Faulty {
    fn info(&self) -> &kiln_core::model::ModelInfo {
        self.inner.info()
    }
    fn kv_groups(&self) -> &[kiln_core::model::KvGroup] {
        self.inner.kv_groups()
    }
    fn state_shapes(&self) -> Vec<Vec<usize>> {
        self.inner.state_shapes()
    }
    fn forward(
        &self,
        ex: &kiln_core::exec::Executor,
        b: &kiln_core::model::ForwardBatch,
        kv: &kiln_core::model::KvCaches,
    ) -> kiln_core::Result<kiln_core::Tensor> {
        assert!(!b.tokens.contains(&PANICS), "the test's poisoned token");
        if b.tokens.contains(&STALLS) {
            std::thread::sleep(Duration::from_secs(3));
        }
        self.inner.forward(ex, b, kv)
    }
}

/// A panic inside a step fails that step's request and the engine goes on serving; an
/// engine that makes no progress with work queued makes /health and new requests answer 503
/// (with Retry-After) until it moves again.
#[test]
fn a_panicking_step_fails_its_request_and_a_wedged_engine_is_reported() {
    use kiln_core::exec::Executor;
    let dir = kiln_tests::fixtures().join("hf/llama");
    let file = kiln_core::load::open_model(&dir).expect("fixture");
    let tokenizer = kiln_core::tokenizer::open_tokenizer(&dir, &file).expect("tokenizer");
    let ex = Executor::cpu();
    let inner = kiln_core::model::build_from_gguf(&file, &ex).expect("model");
    let runner = kiln_core::engine::Runner::new(
        ex,
        Box::new(Faulty { inner }),
        kiln_core::engine::RunnerConfig {
            max_seqs: 2,
            ..Default::default()
        },
    )
    .expect("runner");
    let loaded = kiln_server::load::Loaded {
        path: dir.clone(),
        file,
        tokenizer,
        runner,
    };
    let opts = kiln_server::serve::ServeOptions {
        wedged_after: Duration::from_secs(1),
        ..kiln_server::serve::ServeOptions::new(2)
    };
    let srv = serve(kiln_server::serve::state_with(loaded, opts).expect("server state"));
    let ask = |prompt: Vec<u32>| {
        post(
            srv.addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 2, "temperature": 0}),
        )
    };
    let (st, text) = ask(vec![5, 6, PANICS]);
    assert_eq!(st, 500, "{text}");
    assert!(text.contains("panicked"), "{text}");
    let (st, text) = ask(vec![5, 6, 7]);
    assert_eq!(st, 200, "after a panic: {text}");
    assert_eq!(http(srv.addr, "GET", "/health", b"", None).0, 200);
    let s = srv.state.engine.snapshot();
    assert_eq!(s.kv_free, s.kv_total, "{s:?}");
    // A step that takes 3 s: after 1 s the engine counts as wedged.
    let addr = srv.addr;
    let slow = std::thread::spawn(move || {
        post(
            addr,
            "/v1/completions",
            &json!({"prompt": [5, STALLS], "max_tokens": 1}),
        )
    });
    std::thread::sleep(Duration::from_millis(1600));
    let (st, text) = http(srv.addr, "GET", "/health", b"", None);
    assert_eq!(st, 503, "{text}");
    let (st, text) = ask(vec![5, 6, 8]);
    assert_eq!(st, 503, "{text}");
    assert_eq!(slow.join().expect("slow client").0, 200);
    assert_eq!(http(srv.addr, "GET", "/health", b"", None).0, 200);
}

/// Whether the server has closed `c` (a read gives EOF or a reset) within `within`.
fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    c.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return true,
            // A 408 or other answer before the close: keep reading to the end.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Slow or idle connections are closed after the header timeout, a body that trickles gets
/// 408, and connections past the cap are closed at once.
#[test]
fn slow_idle_and_excess_connections_are_closed() {
    let Some(loaded) = smollm2(256, kiln_core::engine::RunnerConfig::default()) else {
        return;
    };
    let opts = kiln_server::serve::ServeOptions {
        read_timeout: Duration::from_secs(1),
        ..kiln_server::serve::ServeOptions::new(1)
    };
    let st = kiln_server::serve::state_with(loaded, opts).expect("server state");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let limits = kiln_server::serve::ConnLimits {
        max_connections: 4,
        header_timeout: Duration::from_secs(1),
    };
    rt.spawn(kiln_server::serve::serve_connections(
        listener,
        kiln_server::serve::router(st),
        limits,
    ));
    // Headers that never end, and a connection that says nothing.
    let mut slow = TcpStream::connect(addr).expect("connect");
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: kiln\r\n")
        .expect("write");
    let mut idle = TcpStream::connect(addr).expect("connect");
    // A body that stops short of its Content-Length.
    let mut trickle = TcpStream::connect(addr).expect("connect");
    trickle
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        .expect("write");
    // The fourth connection is still allowed; a fifth is closed at once.
    let fourth = TcpStream::connect(addr).expect("connect");
    std::thread::sleep(Duration::from_millis(200));
    let mut fifth = TcpStream::connect(addr).expect("connect");
    assert!(
        closed_within(&mut fifth, Duration::from_millis(500)),
        "a fifth connection stayed open"
    );
    let t0 = Instant::now();
    let mut answer = String::new();
    trickle
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = trickle.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        closed_within(&mut slow, Duration::from_secs(3)),
        "slow headers kept"
    );
    assert!(
        closed_within(&mut idle, Duration::from_secs(3)),
        "an idle connection kept"
    );
    println!("closed after {:?}", t0.elapsed());
    drop(fourth);
    // With the others gone, a normal request goes through.
    std::thread::sleep(Duration::from_millis(100));
    let (st, _) = http(addr, "GET", "/health", b"", None);
    assert_eq!(st, 200);
}

/// 1,000 requests dropped at random moments (before the response head, while queued,
/// prefilling or decoding, streamed or not) leave no request in the engine and every KV
/// block free, on a recurrent model with prefix caching (state slots and snapshots too).
#[test]
fn a_thousand_random_drops_leave_the_pool_free() {
    let path = kiln_tests::fixtures().join("hf/qwen3_5");
    let cfg = kiln_core::engine::RunnerConfig {
        max_seqs: 8,
        max_batch_tokens: 64,
        prefix_caching: true,
        ..kiln_core::engine::RunnerConfig::default()
    };
    let loaded = load_model(&path, 512, cfg);
    let opts = kiln_server::serve::ServeOptions {
        max_queue: 2000,
        ..kiln_server::serve::ServeOptions::new(8)
    };
    let srv = serve(kiln_server::serve::state_with(loaded, opts).expect("server state"));
    let addr = srv.addr;
    let threads: Vec<_> = (0..40u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = kiln_core::rng::Rng::new(1000 + t);
                for i in 0..25 {
                    let stream = rng.next_u64().is_multiple_of(2);
                    let long = "a lighthouse on the rocks ".repeat(1 + (rng.next_u64() % 8) as usize);
                    let body = json!({"prompt": format!("{i} {long}"), "stream": stream,
                                      "max_tokens": 4 + rng.next_u64() % 60, "temperature": 0})
                    .to_string();
                    let mut c = TcpStream::connect(addr).expect("connect");
                    let req = format!(
                        "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    c.write_all(req.as_bytes()).expect("write");
                    // Leave after 0–40 ms, having read something or not.
                    std::thread::sleep(Duration::from_millis(rng.next_u64() % 40));
                    if rng.next_u64().is_multiple_of(2) {
                        let mut buf = [0u8; 256];
                        c.set_read_timeout(Some(Duration::from_millis(5))).expect("timeout");
                        let _ = c.read(&mut buf);
                    }
                    drop(c);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let t0 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        if s.running == 0 && s.waiting == 0 && s.kv_free == s.kv_total {
            println!("{:?}", s.stats);
            assert!(
                s.stats.cancelled > 0,
                "no request was cancelled: {:?}",
                s.stats
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "requests left: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The pool still serves.
    let r = completion(srv.addr, &json!({"prompt": "hello", "max_tokens": 2}));
    assert!(r["choices"][0]["text"].is_string(), "{r}");
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
