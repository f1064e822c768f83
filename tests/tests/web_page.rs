//! kiln's browser page (`scripts/web-build.sh`) in a real browser: headless Chromium, driven by
//! playwright-core (`tests/web/web_page.cjs`), on its WebGPU adapter (SwiftShader here). The
//! page downloads SmolLM2 from a local server into its cache, streams the reply to a typed
//! prompt, equal to native kiln's greedy reply (the server's API, on the CPU), stops a second
//! reply mid-stream, and, opened again with the work in its address, loads the model from the
//! cache (no second download) and writes the same reply into `#output` (with the backend left
//! to the page: on a software adapter, the CPU reference compiled to wasm).
//!
//! Needs the built page (`KILN_TEST_WEB`, else `target/web`), Node, playwright-core and
//! Chromium; skips without them unless `KILN_REQUIRE_BROWSER` is set. `KILN_TEST_SCREENSHOT=
//! FILE` saves the page as README shows it.

#[path = "common/browser.rs"]
mod browser;
#[path = "common/server.rs"]
mod common;

use std::path::{Path, PathBuf};

use browser::{browser_tools, run_page_script};
use common::*;
use kiln_tests::{model_file, required, SMOLLM2};
use serde_json::{json, Value};

const PROMPT: &str = "What is the capital of France?";
const LONG_PROMPT: &str = "Write a long story about a dragon who learns to bake bread.";

/// The built page, or `None` with the reason printed.
fn site() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var_os("KILN_TEST_WEB")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/web"));
    if dir.join("index.html").is_file() && dir.join("pkg/kiln_web_bg.wasm").is_file() {
        return Some(dir);
    }
    assert!(
        !required("BROWSER"),
        "KILN_REQUIRE_BROWSER is set but {} holds no built page: run scripts/web-build.sh",
        dir.display()
    );
    println!(
        "skipping the browser page test: no page in {} (scripts/web-build.sh builds it)",
        dir.display()
    );
    None
}

#[test]
fn the_browser_page_streams_native_greedy_text_stops_and_loads_from_its_cache() {
    let Some(tools) = browser_tools() else {
        return;
    };
    let Some(web) = site() else {
        return;
    };
    let Some(model) = model_file(SMOLLM2) else {
        return;
    };
    // Native kiln's greedy reply to the same conversation.
    let max_tokens = 16;
    let want = {
        let Some(srv) = start(1, None) else {
            return;
        };
        let body = json!({"messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                          "max_tokens": max_tokens});
        let (st, text) = http(
            srv.addr,
            "POST",
            "/v1/chat/completions",
            body.to_string().as_bytes(),
            None,
        );
        assert_eq!(st, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        v["choices"][0]["message"]["content"]
            .as_str()
            .expect("an answer")
            .to_string()
    };
    assert!(!want.is_empty());

    let seen = run_page_script(
        &tools,
        "web_page.cjs",
        &[
            ("WEB_DIR", web.clone().into_os_string()),
            ("MODEL", model.clone().into_os_string()),
            ("PROMPT", PROMPT.into()),
            ("MAX_TOKENS", max_tokens.to_string().into()),
            ("LONG_PROMPT", LONG_PROMPT.into()),
        ],
    );

    assert_eq!(seen["loadError"], json!(""));
    assert_eq!(
        seen["firstLoad"]["cached"],
        json!("false"),
        "the first load downloads"
    );
    // Streamed: the reply showed in pieces before it was complete.
    let lengths = seen["lengths"].as_array().expect("lengths");
    assert!(
        lengths.len() >= 3,
        "the reply did not stream: lengths seen {lengths:?}"
    );
    assert_eq!(
        seen["first"]["text"],
        json!(want),
        "the page's reply vs native kiln's"
    );
    assert_eq!(seen["first"]["error"], Value::Null);
    assert!(seen["first"]["decodeTps"].as_f64() > Some(0.0), "{seen}");
    // Stopped mid-stream.
    assert_eq!(seen["stopEnabled"], json!(true));
    assert_eq!(seen["stopped"]["finish"], json!("cancelled"));
    let stopped = seen["stopped"]["tokens"].as_u64().unwrap_or(0);
    assert!((1..400).contains(&stopped), "{seen}");
    assert_eq!(seen["userMessages"], json!([PROMPT, LONG_PROMPT]));
    // The address's work, with the model from the cache.
    assert_eq!(
        seen["reload"]["cached"],
        json!("true"),
        "the reload did not use the cache"
    );
    assert_eq!(seen["modelFetchesOnReload"], json!(0));
    assert_eq!(seen["fromAddress"]["text"], json!(want));
    // Left to itself, the page runs the CPU reference on a software adapter (SwiftShader here).
    let device = seen["device"].as_str().unwrap_or("");
    assert!(device.starts_with("WebGPU"), "{device}");
    if device.contains("(software)") {
        let reload = seen["reloadDevice"].as_str().unwrap_or("");
        assert!(reload.contains("CPU"), "auto picked {reload}");
    }
    let errors = seen["consoleErrors"].as_array().expect("console errors");
    assert!(errors.is_empty(), "the page logged errors: {errors:?}");
    println!(
        "SmolLM2 in the browser ({}): decode {:.2} tokens/s, prompt {:.1} tokens/s; first load {} ms fetch + {} ms load, cached reload {} ms + {} ms",
        seen["device"].as_str().unwrap_or("?"),
        seen["first"]["decodeTps"].as_f64().unwrap_or(0.0),
        seen["first"]["promptTps"].as_f64().unwrap_or(0.0),
        seen["firstLoad"]["fetchMs"],
        seen["firstLoad"]["loadMs"],
        seen["reload"]["fetchMs"],
        seen["reload"]["loadMs"],
    );
}
