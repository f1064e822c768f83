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
            Some("messages"),
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
