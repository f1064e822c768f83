//! `kiln serve` under load and misbehaving clients, end to end over real TCP: a burst past
//! the queue limit, huge prompts beside /health, clients that never read, a step that panics
//! or stalls, slow, idle and excess connections, and a thousand requests dropped at random.

#[path = "common/server.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// 500 requests at once against a queue of 64: each gets its completion or a 429 (an
/// OpenAI-style rate-limit error), never a 5xx or a hang; the engine never holds more than
/// the limit (what bounds the server's memory: a refused request holds nothing past its
/// answer); the pool is free afterwards.
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
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (state, stop) = (srv.state.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let s = state.engine.snapshot();
                most = most.max(s.waiting + s.running);
                std::thread::sleep(Duration::from_millis(1));
            }
            most
        })
    };
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().expect("watcher");
    println!(
        "{counts:?} in {:.1} s; at most {most} requests held",
        t0.elapsed().as_secs_f64()
    );
    // --max-queue 64 beside --max-batch 2.
    assert!((10..=66).contains(&most), "{most} requests held at once");
    assert!(counts.get(&200).copied().unwrap_or(0) >= 66, "{counts:?}");
    assert!(counts.get(&429).copied().unwrap_or(0) > 0, "{counts:?}");
    let s = srv.state.engine.snapshot();
    assert_eq!((s.running, s.waiting), (0, 0), "{s:?}");
    assert_eq!(s.kv_free, s.kv_total, "{s:?}");
}

/// Tokenizing runs off the async workers: while 16 clients send prompts of almost 1 MiB
/// (10 admitted at once, the rest 429), /health answers in well under 100 ms.
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
    let mut tokenized = 0;
    for c in clients {
        let (st, text) = c.join().expect("client");
        let head = &text[..text.len().min(300)];
        match st {
            // Far longer than the context: refused, after tokenizing.
            400 => {
                assert!(text.contains("context"), "{head}");
                tokenized += 1;
            }
            // Preparation holds an admission slot: past --max-concurrent (10 here), 429.
            429 => assert!(text.contains("rate_limit_error"), "{head}"),
            _ => panic!("{st}: {head}"),
        }
    }
    assert!(tokenized >= 10, "only {tokenized} prompts were tokenized");
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
        vision: None,
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
