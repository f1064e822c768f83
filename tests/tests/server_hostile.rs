//! `kiln serve` against the inputs an adversarial review used to take it down, over real TCP:
//! JSON schemas whose `$ref`s chain hundreds deep and Lark grammars of a thousand chained
//! rules (once a stack overflow that aborted the process), and a model whose chat template
//! doubles a string forty times or loops 10^10 times (once gigabytes of memory, and a CPU
//! kept busy after its client left). Each at the review's size and at twice it: the answer
//! is a 400 naming the limit within seconds, the server's memory stays put, no render is
//! left running, and the server goes on answering. Uses the tiny Qwen3 fixture (no
//! downloads).

#[path = "common/server.rs"]
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use kiln_core::chat::RenderLimits;
use kiln_core::engine::RunnerConfig;
use kiln_server::serve::{state_with, ServeOptions};
use kiln_tests::grammars::{lark_chain, ref_chain};
use serde_json::{json, Value};

/// The tests count this process's render children: one at a time.
static ONE: Mutex<()> = Mutex::new(());

/// A template that behaves unless `chat_template_kwargs` says otherwise: `grow` doubles a
/// string `n` times, `spin` runs two nested loops of `n` (`spin3` three; minijinja allows
/// ranges of 100,000 at most).
const TEMPLATE: &str = "{% if mode is defined and mode == 'grow' %}{% set s = namespace(v='ab') %}{% for i in range(n) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v | length }}{% elif mode is defined and mode == 'spin' %}{% for i in range(n) %}{% for j in range(n) %}{% endfor %}{% endfor %}{% elif mode is defined and mode == 'spin3' %}{% for i in range(n) %}{% for j in range(n) %}{% for k in range(n) %}{% endfor %}{% endfor %}{% endfor %}{% else %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}{% endif %}";

fn server(tag: &str, opts: impl FnOnce(&mut ServeOptions)) -> Server {
    let dir = fixture_copy("qwen3", tag);
    let cfg = json!({"eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": TEMPLATE});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let run = RunnerConfig {
        max_seqs: 2,
        max_batch_tokens: 64,
        prefix_caching: true,
        ..RunnerConfig::default()
    };
    let mut o = ServeOptions::new(2);
    opts(&mut o);
    serve(state_with(load_model(&dir, 256, run), o).expect("server state"))
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                       "temperature": 0});
    if let (Some(b), Value::Object(e)) = (b.as_object_mut(), extra) {
        b.extend(e);
    }
    b
}

/// The message of an OpenAI-style error body.
fn message(text: &str) -> String {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// This process's resident memory, bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Processes whose parent is a child of this process: the sandbox's render children.
fn render_children() -> usize {
    let parent_of = |pid: &str| -> Option<u32> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name in parentheses: state, then the parent's pid.
        s.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let me = std::process::id();
    let all: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().to_string();
                Some((name.parse().ok()?, parent_of(&name)?))
            })
            .collect()
        })
        .unwrap_or_default();
    let zygotes: Vec<u32> = all.iter().filter(|p| p.1 == me).map(|p| p.0).collect();
    all.iter().filter(|p| zygotes.contains(&p.1)).count()
}

#[test]
fn deep_schemas_and_chained_grammars_get_400_and_the_server_stays_up() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let srv = server("hostile-grammar", |_| {});
    for n in [300, 600] {
        let schema = ref_chain(n);
        let body = chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "deep", "schema": schema}}}));
        let t = Instant::now();
        let (st, text) = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(st, 400, "{n}: {text}");
        let m = message(&text);
        assert!(m.contains("$ref") && m.contains("limit"), "{m}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    for n in [1000, 2000] {
        let (st, text) = post(
            srv.addr,
            "/v1/chat/completions",
            &chat(json!({"grammar": lark_chain(n)})),
        );
        assert_eq!(st, 400, "{n}: {text}");
        let m = message(&text);
        assert!(m.contains("rule references") && m.contains("limit"), "{m}");
    }
    // Tool schemas compile through the same limits (a forced call).
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": ref_chain(300)}}]);
    let (st, text) = post(
        srv.addr,
        "/v1/chat/completions",
        &chat(json!({"tools": tools, "tool_choice": "required"})),
    );
    assert!((400..500).contains(&st), "{st}: {text}");
    let (st, text) = post(srv.addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(st, 200, "{text}");
    assert_eq!(srv.state.engine.snapshot().running, 0);
}

#[test]
fn hostile_templates_end_in_a_400_within_seconds_with_memory_bounded() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let srv = server("hostile-template", |_| {});
    let before = rss();
    // The review's sizes, then twice them.
    for (mode, n, limit) in [
        ("grow", 40, "memory|time"),
        ("grow", 80, "memory|time"),
        // Fuel ends a spin within about a second; on a slow machine the clock may first.
        ("spin", 100_000, "fuel|time"),
        ("spin3", 100_000, "fuel|time"),
    ] {
        let body = chat(json!({"chat_template_kwargs": {"mode": mode, "n": n}}));
        let t = Instant::now();
        let (st, text) = post(srv.addr, "/v1/chat/completions", &body);
        let took = t.elapsed();
        assert_eq!(st, 400, "{mode} {n}: {text}");
        let m = message(&text);
        assert!(
            limit
                .split('|')
                .any(|l| m.contains(&format!("template {l} limit"))),
            "{mode} {n}: {m}"
        );
        assert!(took < Duration::from_secs(8), "{mode} {n}: {took:?}");
        let grew = rss().saturating_sub(before);
        assert!(
            grew < 200 << 20,
            "{mode} {n}: the server grew by {grew} bytes"
        );
        assert_eq!(
            render_children(),
            0,
            "{mode} {n}: a render is still running"
        );
    }
    let metrics = metrics_text(srv.addr);

    let count = |outcome: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "kiln_template_renders_total{{outcome=\"{outcome}\"}} "
                ))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Two grew (memory, or the clock on a loaded machine), two spun (fuel or the clock).
    assert_eq!(
        count("memory") + count("fuel") + count("time"),
        4.0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "kiln_template_renders_active"), 0.0);
    // The server goes on: a chat and a completion.
    let (st, text) = post(srv.addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(st, 200, "{text}");
    completion(srv.addr, &json!({"prompt": "Hi", "max_tokens": 2}));
}

/// Opens a chat request whose render spins until stopped, and returns the connection.
fn spinning_request(addr: std::net::SocketAddr) -> TcpStream {
    let body = chat(json!({"chat_template_kwargs": {"mode": "spin", "n": 100_000}})).to_string();
    let mut c = TcpStream::connect(addr).expect("connect");
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    c
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "waited for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_render_whose_client_left_is_stopped_and_renders_count_as_admitted() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let srv = server("hostile-cancel", |o| {
        // Room for the render to spin until its client leaves.
        o.template_limits = RenderLimits {
            fuel: u64::MAX >> 2,
            timeout: Duration::from_secs(120),
            ..RenderLimits::default()
        };
        o.max_concurrent = Some(1);
    });
    let active = || metric(&metrics_text(srv.addr), "kiln_template_renders_active");
    let conn = spinning_request(srv.addr);
    wait_for("the render to start", || active() == 1.0);
    wait_for("the render child", || render_children() == 1);
    // A render holds its request's admission: a second request is over --max-concurrent.
    let (st, text) = post(
        srv.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(st, 429, "{text}");
    // The client leaves: the render stops, and nothing keeps a CPU busy.
    drop(conn);
    let t = Instant::now();
    wait_for("the render to stop", || active() == 0.0);
    wait_for("the render child to end", || render_children() == 0);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(
        metric(
            &metrics_text(srv.addr),
            "kiln_template_renders_total{outcome=\"cancelled\"}"
        ),
        1.0
    );
    completion(srv.addr, &json!({"prompt": "Hi", "max_tokens": 2}));
}
