//! The chat page of `kiln serve` in a real browser: headless Chromium driven by playwright-core
//! (`tests/web/chat_page.cjs`) against a server of SmolLM2 with an API key. The page asks for
//! the key, streams a greedy answer equal to the API's for the same conversation, stops a
//! second answer mid-stream (the request leaves /slots and frees its KV blocks), and finds the
//! conversation again after a reload.
//!
//! Needs Node, playwright-core and Chromium (see `common/browser.rs`); skips without them
//! unless `KILN_REQUIRE_BROWSER` is set.
//! `KILN_TEST_SCREENSHOT=FILE` saves the page as README shows it.

#[path = "common/browser.rs"]
mod browser;
#[path = "common/server.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use browser::{browser_tools, run_page_script};
use common::*;
use kiln_tests::{model_file, required, SMOLLM2};
use serde_json::{json, Value};

const KEY: &str = "page-test-key";
const PROMPT: &str = "What is the capital of France?";
const LONG_PROMPT: &str = "Write a long story about a dragon who learns to bake bread.";

#[test]
fn the_chat_page_streams_the_greedy_answer_stops_and_keeps_the_conversation() {
    let Some(tools) = browser_tools() else {
        return;
    };
    let Some(srv) = start(2, Some(KEY)) else {
        return;
    };
    // The API's greedy answer for the same conversation.
    let max_tokens = 24;
    let body = json!({"messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                      "max_tokens": max_tokens});
    let (st, text) = http(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
        Some(KEY),
    );
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let want = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("an answer")
        .to_string();
    assert!(!want.is_empty());

    let seen = run_page_script(
        &tools,
        "chat_page.cjs",
        &[
            ("KILN_URL", format!("http://{}", srv.addr).into()),
            ("KILN_KEY", KEY.into()),
            ("PROMPT", PROMPT.into()),
            ("MAX_TOKENS", max_tokens.to_string().into()),
            ("LONG_PROMPT", LONG_PROMPT.into()),
        ],
    );

    assert_eq!(seen["models"], json!([srv.state.model]), "the model picker");
    assert_eq!(
        seen["settingsHidden"],
        json!(true),
        "the settings panel closes"
    );
    // Streamed: the answer showed in pieces before it was complete.
    let lengths = seen["lengths"].as_array().expect("lengths");
    assert!(
        lengths.len() >= 3,
        "the answer did not stream: lengths seen {lengths:?}"
    );
    assert_eq!(
        seen["answer"],
        json!(want),
        "the page's answer vs the API's"
    );
    assert_eq!(seen["errors"], json!([]));
    // Stopped mid-stream: the page says so, and the server let the request go.
    assert!(seen["busyBeforeStop"].as_u64() >= Some(1), "{seen}");
    assert_eq!(seen["stopped"], json!(true));
    assert!(!seen["stoppedAnswer"].as_str().unwrap_or("").is_empty());
    assert_eq!(
        seen["slotsAfterStop"],
        json!(0),
        "the stopped request is still in /slots"
    );
    assert_eq!(
        seen["kvUsedAfterStop"],
        json!(0),
        "KV blocks still in use after the stop"
    );
    // The reload finds the conversation.
    assert_eq!(seen["conversations"], json!([PROMPT]));
    assert_eq!(seen["answerAfterReload"], json!(want));
    assert_eq!(seen["userMessages"], json!([PROMPT, LONG_PROMPT]));
    // No script errors (the one 401 before the key was given is the server's answer).
    let errors: Vec<&str> = seen["consoleErrors"]
        .as_array()
        .expect("console errors")
        .iter()
        .filter_map(Value::as_str)
        .filter(|e| !e.contains("401"))
        .collect();
    assert!(errors.is_empty(), "the page logged errors: {errors:?}");
}

/// Without a browser: the page and its assets answer without the key (with a policy that
/// allows only their own script), the API still wants it, and `--no-webui` turns the page off.
#[test]
fn the_page_needs_no_key_and_no_webui_turns_it_off() {
    let Some(srv) = start(1, Some(KEY)) else {
        return;
    };
    let raw = |addr, path: &str| {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        std::io::Write::write_all(
            &mut s,
            format!("GET {path} HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .expect("write");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut s, &mut text).expect("read");
        text
    };
    let page = raw(srv.addr, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let head = page.to_ascii_lowercase();
    assert!(head.contains("content-type: text/html"));
    assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"));
    assert!(page.contains("data-testid=\"prompt\""));
    for asset in ["/webui/app.js", "/webui/app.css", "/webui/icon.svg"] {
        assert!(raw(srv.addr, asset).starts_with("HTTP/1.1 200"), "{asset}");
    }
    assert!(raw(srv.addr, "/v1/models").starts_with("HTTP/1.1 401"));
    assert!(raw(srv.addr, "/webui/other.js").starts_with("HTTP/1.1 401"));
    drop(srv);

    let Some(model) = model_file(SMOLLM2) else {
        return;
    };
    let off = serve(
        kiln_server::serve::state_with(
            load_model(&model, 256, Default::default()),
            kiln_server::serve::ServeOptions {
                webui: false,
                ..kiln_server::serve::ServeOptions::new(1)
            },
        )
        .expect("server state"),
    );
    assert!(raw(off.addr, "/").starts_with("HTTP/1.1 404"));
    assert!(raw(off.addr, "/webui/app.js").starts_with("HTTP/1.1 404"));
}

/// The page's markdown renderer on hostile text (`tests/web/markdown.cjs`, in Node): every
/// input ends — a renderer that loops on one (a list item holding a line separator did) would
/// freeze the tab each time that conversation is shown — links only for http(s) and mailto,
/// no element but the renderer's own.
#[test]
fn the_markdown_renderer_ends_on_hostile_text_and_links_only_the_web() {
    let node_ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok {
        assert!(
            !required("BROWSER"),
            "KILN_REQUIRE_BROWSER is set but there is no node"
        );
        println!("skipping: no node");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut child = Command::new("node")
        .arg(root.join("tests/web/markdown.cjs"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("node starts");
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the markdown renderer did not finish in 120 s (a loop on some input)");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success() && stdout.starts_with("ok "),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
