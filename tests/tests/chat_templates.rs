//! Real chat templates (Qwen3.5's and Gemma 4's, from llama.cpp's `models/templates`) render
//! byte for byte what transformers' `apply_chat_template` renders
//! (`tests/fixtures/chat/renders.json`, made by `make_chat_fixtures.py`): system prompts,
//! tools, tool calls and results, reasoning, several turns, `enable_thinking` on and off.
//!
//! The templates are read from `KILN_TEST_TEMPLATES` (`.ci/run` unpacks them from the PyPI
//! source package of llama-cpp-python 0.3.36 into `target/templates`); without it the test
//! skips, unless `KILN_REQUIRE_TEMPLATES=1`.

use kiln_core::chat::ChatTemplate;
use kiln_tests::{fixtures, required};
use serde_json::Value;

#[test]
fn real_templates_render_what_transformers_renders() {
    let dir = std::env::var("KILN_TEST_TEMPLATES").unwrap_or_default();
    if dir.is_empty() || !std::path::Path::new(&dir).is_dir() {
        assert!(
            !required("TEMPLATES"),
            "KILN_REQUIRE_TEMPLATES is set but KILN_TEST_TEMPLATES ({dir:?}) is not a directory"
        );
        println!("skipping: KILN_TEST_TEMPLATES names no template directory");
        return;
    }
    let f: Value = serde_json::from_slice(
        &std::fs::read(fixtures().join("chat").join("renders.json")).expect("renders.json"),
    )
    .expect("JSON");
    let convs = f["conversations"].as_array().expect("conversations");
    let mut checked = 0;
    let mut failures = Vec::new();
    for r in f["renders"].as_array().expect("renders") {
        let name = r["template"].as_str().expect("name");
        let src = std::fs::read_to_string(format!("{dir}/{name}.jinja")).expect("template");
        let t = ChatTemplate::new(
            &src,
            r["bos"].as_str().unwrap_or(""),
            r["eos"].as_str().unwrap_or(""),
        )
        .expect("compiles");
        let i = r["conversation"].as_u64().expect("index") as usize;
        let c = &convs[i];
        let messages = c["messages"].as_array().expect("messages");
        let tools = c.get("tools");
        let kwargs = r["kwargs"].as_object().cloned().unwrap_or_default();
        let want = r["text"].as_str().expect("text");
        match t.render_with(messages, tools, true, &kwargs) {
            Ok(got) if got == want => checked += 1,
            Ok(got) => {
                let at = got
                    .bytes()
                    .zip(want.bytes())
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(want.len()));
                let lo = at.saturating_sub(60);
                failures.push(format!(
                    "{name} / {} / {kwargs:?}: differs at byte {at}:\n  kiln:         {:?}\n  transformers: {:?}",
                    c["name"],
                    got.get(lo..(at + 60).min(got.len())).unwrap_or(""),
                    want.get(lo..(at + 60).min(want.len())).unwrap_or("")
                ))
            }
            Err(e) => failures.push(format!("{name} / {} / {kwargs:?}: {e}", c["name"])),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 40, "only {checked} renderings checked");
}
