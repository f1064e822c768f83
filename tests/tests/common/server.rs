//! What the `kiln serve` tests share: an in-process server on a free port, and plain HTTP/1.1
//! over real TCP.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use kiln_core::engine::RunnerConfig;
use kiln_server::load::{load, Loaded, ModelArgs};
use kiln_server::serve::{router, state, AppState};
use kiln_tests::{model_file, SMOLLM2};
use serde_json::Value;

pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    _rt: tokio::runtime::Runtime,
}

pub fn start(max_batch: usize, api_key: Option<&str>) -> Option<Server> {
    start_model(&model_file(SMOLLM2)?, max_batch, api_key)
}

/// The model at `path` (a GGUF file or a Hugging Face directory) loaded as `kiln serve`
/// loads it, on the CPU, with a context of `ctx`.
pub fn load_model(path: &std::path::Path, ctx: usize, cfg: RunnerConfig) -> Loaded {
    let args = ModelArgs {
        ctx: Some(ctx),
        ..ModelArgs::new(Some(path.display().to_string()), "cpu")
    };
    load(&args, cfg).expect("model loads")
}

/// SmolLM2 loaded as by [`load_model`]; `None` (the test skips) when it is not downloaded.
pub fn smollm2(ctx: usize, cfg: RunnerConfig) -> Option<Loaded> {
    Some(load_model(&model_file(SMOLLM2)?, ctx, cfg))
}

/// Reads one HTTP/1.1 response from `s` to its end: (status, body with any chunked encoding
/// removed).
pub fn read_response(s: &mut impl Read) -> (u16, String) {
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

/// A server of the model at `path` (a GGUF file or a Hugging Face directory), as `start`.
pub fn start_model(
    path: &std::path::Path,
    max_batch: usize,
    api_key: Option<&str>,
) -> Option<Server> {
    start_with(path, max_batch, api_key, |_| {})
}

/// [`start_model`] with the model flags changed by `edit` (cache types, say) first.
pub fn start_with(
    path: &std::path::Path,
    max_batch: usize,
    api_key: Option<&str>,
    edit: impl FnOnce(&mut ModelArgs),
) -> Option<Server> {
    let mut args = ModelArgs {
        ctx: Some(512),
        ..ModelArgs::new(Some(path.display().to_string()), "cpu")
    };
    edit(&mut args);
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
    Some(serve(st))
}

/// Serves `st` on `listener` (a bound, listening std socket) from a runtime of its own.
pub fn serve_on(st: Arc<AppState>, listener: std::net::TcpListener) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(listener).expect("tokio listener")
    };
    // The connection loop `kiln serve` runs, with its default limits.
    let limits = kiln_server::serve::ConnLimits {
        max_connections: 1024,
        header_timeout: std::time::Duration::from_secs(30),
    };
    rt.spawn(kiln_server::serve::serve_connections(
        listener,
        router(st.clone()),
        limits,
    ));
    Server {
        addr,
        state: st,
        _rt: rt,
    }
}

/// Serves `st` on a free local port from a runtime of its own.
pub fn serve(st: Arc<AppState>) -> Server {
    serve_on(
        st,
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
    )
}

/// One HTTP/1.1 exchange: (status, body with any chunked encoding removed).
pub fn http(
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
    read_response(&mut s)
}

pub fn dechunk(mut s: &str) -> String {
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

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
    http(addr, "POST", path, body.to_string().as_bytes(), None)
}

/// The text of a streamed completion, from its SSE body (which must end with [DONE]).
pub fn streamed_text(body: &str) -> String {
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

pub fn get(addr: SocketAddr, path: &str) -> Value {
    let (st, body) = http(addr, "GET", path, b"", None);
    assert_eq!(st, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// A sample's value in Prometheus text (`name` with its labels, exactly as written).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

pub fn metrics_text(addr: SocketAddr) -> String {
    let (st, text) = http(addr, "GET", "/metrics", b"", None);
    assert_eq!(st, 200);
    text
}

pub fn completion(addr: SocketAddr, body: &Value) -> Value {
    let (st, text) = post(addr, "/v1/completions", body);
    assert_eq!(st, 200, "{text}");
    serde_json::from_str(&text).expect("JSON")
}

/// The tiny Qwen3 fixture with a chat template that offers tools and asks for Hermes-style
/// `<tool_call>` JSON (as Qwen's own templates do), copied to a scratch directory.
pub fn tiny_with_tools(tag: &str) -> std::path::PathBuf {
    let dir = fixture_copy("qwen3", &format!("{tag}-tools"));
    let template = "{% if tools %}{{ '<|im_start|>system\\nTools: ' }}{% for t in tools %}{{ t.function.name + ' ' }}{% endfor %}{{ 'Call one as <tool_call>\\n{\"name\": …, \"arguments\": …}\\n</tool_call><|im_end|>\\n' }}{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let cfg = serde_json::json!({"eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    dir
}

/// The tiny fixture `family` copied to a scratch directory named after `tag`, without its
/// tokenizer_config.json (the caller writes its own).
pub fn fixture_copy(family: &str, tag: &str) -> std::path::PathBuf {
    let src = kiln_tests::fixtures().join("hf").join(family);
    let dir = std::env::temp_dir().join(format!("kiln-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    for e in std::fs::read_dir(&src).expect("fixture") {
        let e = e.expect("entry");
        if e.file_name() != "tokenizer_config.json" {
            std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
        }
    }
    dir
}

/// `n` connections, each with a streamed greedy completion of 400 tokens sent and nothing read
/// yet (drop them to leave mid-stream).
pub fn long_streams(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let body = serde_json::json!({"prompt": "Tell me a long story about", "max_tokens": 400,
                                  "temperature": 0, "stream": true})
    .to_string();
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(head.as_bytes()).expect("write");
            s
        })
        .collect()
}

/// A chat completion of one user message holding images `a` and `b` (files in `dir`, sent as
/// `data:` URLs) around the text "Once upon": greedy, 4 tokens, with the top 3
/// log-probabilities. The answer's JSON.
pub fn chat_two_images(addr: SocketAddr, dir: &std::path::Path, a: &str, b: &str) -> Value {
    use base64::Engine as _;
    let url = |name: &str| {
        let bytes = std::fs::read(dir.join(name)).expect("image file");
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    };
    let req = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url(a)}},
        {"type": "text", "text": "Once upon"},
        {"type": "image_url", "image_url": {"url": url(b)}}]}],
        "max_tokens": 4, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let (st, body) = post(addr, "/v1/chat/completions", &req);
    assert_eq!(st, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// [`chat_two_images`] with the wide and the square image of `dir`, three times: the first
/// request caches nothing and has more than `soft` prompt tokens (the images' soft tokens);
/// the same request again takes at least `cached` from the prefix cache and gives the same
/// log-probabilities; the images swapped are another prompt. The first answer.
pub fn check_image_caching(
    addr: SocketAddr,
    dir: &std::path::Path,
    soft: u64,
    cached: u64,
) -> Value {
    let run = |a: &str, b: &str| chat_two_images(addr, dir, a, b);
    let first = run("wide.png", "square.png");
    let again = run("wide.png", "square.png");
    let swapped = run("square.png", "wide.png");
    let hit = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let lps = |v: &Value| v["choices"][0]["logprobs"]["content"].clone();
    let prompt = first["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt tokens");
    println!(
        "prompt {prompt}; cached {:?} {:?} {:?}",
        hit(&first),
        hit(&again),
        hit(&swapped)
    );
    assert!(prompt > soft, "{first}");
    assert_eq!(hit(&first), Some(0), "{first}");
    assert!(hit(&again).is_some_and(|n| n >= cached), "{again}");
    assert_eq!(lps(&again), lps(&first));
    assert_ne!(lps(&swapped), lps(&first));
    first
}
