//! Each model family's own chat format through `kiln serve`: the tiny Qwen3.5 and Gemma 4
//! checkpoints with their real chat templates (read from `KILN_TEST_TEMPLATES`, as in
//! `chat_templates.rs`). Tool calls forced by `tool_choice` come back as `tool_calls` in
//! Qwen's XML and Gemma 4's `<|tool_call>` formats, reasoning as `reasoning_content`, streamed
//! and not (the streamed pieces add up to the same message); OpenAI-style histories (JSON-text
//! arguments, tool results) render in each template's format; `chat_template_kwargs` reaches
//! the template.

#[path = "common/server.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::*;
use kiln_tests::required;
use serde_json::{json, Value};

fn templates() -> Option<PathBuf> {
    let dir = std::env::var("KILN_TEST_TEMPLATES").unwrap_or_default();
    if dir.is_empty() || !Path::new(&dir).is_dir() {
        assert!(
            !required("TEMPLATES"),
            "KILN_REQUIRE_TEMPLATES is set but KILN_TEST_TEMPLATES ({dir:?}) is not a directory"
        );
        println!("skipping: KILN_TEST_TEMPLATES names no template directory");
        return None;
    }
    Some(PathBuf::from(dir))
}

/// The fixture `family` with the real template `template` and `eos` as its end token, in a
/// scratch directory.
fn with_template(family: &str, template: &Path, eos: &str) -> PathBuf {
    let dir = fixture_copy(family, &format!("format-{family}"));
    // The real templates' tool prompts run to ~1,000 byte-level tokens of the tiny
    // vocabulary: room for them (the weights are random; positions are RoPE's).
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config"))
            .expect("config JSON");
    for c in [&mut config] {
        if c.get("max_position_embeddings").is_some() {
            c["max_position_embeddings"] = json!(4096);
        }
        if c.get("text_config").is_some() {
            c["text_config"]["max_position_embeddings"] = json!(4096);
        }
    }
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write");
    let tpl = std::fs::read_to_string(template).expect("template");
    let cfg = json!({"eos_token": eos, "add_bos_token": false, "chat_template": tpl});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    dir
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city", "unit"]}}})
}

fn clock() -> Value {
    json!({"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                       "required": ["zone"]}}})
}

/// The arguments follow `get_weather`'s or `get_time`'s schema (checked by hand: required
/// keys, types, enums, bounds).
fn check_arguments(name: &str, args: &str) {
    let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args}: {e}"));
    let o = v.as_object().expect("an object");
    match name {
        "get_weather" => {
            let city = o["city"].as_str().expect("city is a string");
            assert!(city.chars().count() <= 12, "{args}");
            assert!(
                ["C", "F"].contains(&o["unit"].as_str().expect("unit")),
                "{args}"
            );
            if let Some(d) = o.get("days") {
                let d = d.as_i64().expect("days is an integer");
                assert!((1..=9).contains(&d), "{args}");
            }
            assert!(
                o.keys()
                    .all(|k| ["city", "days", "unit"].contains(&k.as_str())),
                "{args}"
            );
        }
        "get_time" => assert!(
            ["UTC", "CET"].contains(&o["zone"].as_str().expect("zone")),
            "{args}"
        ),
        other => panic!("unknown function {other}"),
    }
}

/// A chat answer's message, whole and streamed (the deltas joined): content, reasoning and
/// the tool calls as (name, arguments).
#[derive(Debug, PartialEq)]
struct Msg {
    content: String,
    reasoning: String,
    calls: Vec<(String, String)>,
    finish: String,
}

fn ask(addr: std::net::SocketAddr, body: &Value) -> Msg {
    let (code, text) = post(addr, "/v1/chat/completions", body);
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let m = &v["choices"][0]["message"];
    let whole = Msg {
        content: m["content"].as_str().unwrap_or("").to_string(),
        reasoning: m["reasoning_content"].as_str().unwrap_or("").to_string(),
        calls: m["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["function"]["name"].as_str().unwrap_or("").to_string(),
                    c["function"]["arguments"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect(),
        finish: v["choices"][0]["finish_reason"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    };
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (code, text) = post(addr, "/v1/chat/completions", &sb);
    assert_eq!(code, 200, "{text}");
    let mut s = Msg {
        content: String::new(),
        reasoning: String::new(),
        calls: Vec::new(),
        finish: String::new(),
    };
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(line).expect("chunk JSON");
        let c = &v["choices"][0];
        let d = &c["delta"];
        s.content.push_str(d["content"].as_str().unwrap_or(""));
        s.reasoning
            .push_str(d["reasoning_content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            s.calls.push((
                tc["function"]["name"].as_str().unwrap_or("").to_string(),
                tc["function"]["arguments"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            ));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            s.finish = f.to_string();
        }
    }
    assert_eq!(s, whole, "streamed and whole differ for {body}");
    whole
}

fn forced_calls(addr: std::net::SocketAddr, extra: Value) {
    let tools = json!([weather(), clock()]);
    for (choice, parallel) in [
        (json!("required"), false),
        (json!("required"), true),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            false,
        ),
    ] {
        for seed in 0..3 {
            let mut body = json!({"messages": [{"role": "user", "content": "Weather in Oslo?"}],
                "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
                "max_tokens": 400, "temperature": 0.8, "seed": seed});
            for (k, v) in extra.as_object().into_iter().flatten() {
                body[k] = v.clone();
            }
            let m = ask(addr, &body);
            // With parallel calls a random model may go on calling until max_tokens.
            assert!(
                m.finish == "tool_calls" || (parallel && m.finish == "length"),
                "{choice} {seed}: {m:?}"
            );
            assert!(!m.calls.is_empty(), "{m:?}");
            if !parallel {
                assert_eq!(m.calls.len(), 1, "{m:?}");
            }
            for (name, args) in &m.calls {
                if choice.is_object() {
                    assert_eq!(name, "get_time");
                }
                check_arguments(name, args);
            }
        }
    }
}

/// The prompt `/apply-template` renders for `body`.
fn rendered(addr: std::net::SocketAddr, body: &Value) -> String {
    let (code, text) = post(addr, "/apply-template", body);
    assert_eq!(code, 200, "{text}");
    serde_json::from_str::<Value>(&text).expect("JSON")["prompt"]
        .as_str()
        .expect("prompt")
        .to_string()
}

/// An OpenAI-style history: the assistant's call with JSON-text arguments, the tool's result.
fn history() -> Value {
    json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"C\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
    ])
}

#[test]
fn qwen3_5_xml_calls_and_thinking() {
    let Some(t) = templates() else {
        return;
    };
    let dir = with_template("qwen3_5", &t.join("Qwen3.5-4B.jinja"), "<|im_end|>");
    let srv = start_with(&dir, 2, None, |a| a.ctx = Some(4096)).expect("server");
    let props = get(srv.addr, "/props");
    assert_eq!(props["tool_calls"], true, "{props}");
    assert_eq!(props["reasoning"], true, "{props}");
    // The template opens <think> itself: a forced call closes it first.
    forced_calls(srv.addr, json!({}));
    // Reasoning, then the answer: the shape forced by a grammar, the split by the parser.
    let m = ask(
        srv.addr,
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 120,
                "temperature": 0.8, "seed": 1,
                "grammar": "start: /[a-z]{2,8}( [a-z]{2,8}){1,3}/ \"\\n</think>\\n\\n\" /[a-z]{2,8}( [a-z]{2,8}){1,3}/\n"}),
    );
    assert!(!m.reasoning.is_empty() && !m.content.is_empty(), "{m:?}");
    assert!(
        !m.reasoning.contains("think") && !m.content.contains('<'),
        "{m:?}"
    );
    // enable_thinking false: the template writes an empty think block; the output is content.
    let prompt = rendered(
        srv.addr,
        &json!({"messages": [{"role": "user", "content": "Hi"}],
                "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt}");
    let m = ask(
        srv.addr,
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                "temperature": 0, "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert!(m.reasoning.is_empty(), "{m:?}");
    // A history with a call and its result renders in Qwen's XML.
    let p = rendered(
        srv.addr,
        &json!({"messages": history(), "tools": [weather()]}),
    );
    assert!(
        p.contains("<function=get_weather>\n<parameter=city>\nOslo\n</parameter>"),
        "{p}"
    );
    assert!(p.contains("<tool_response>\n-3 C\n</tool_response>"), "{p}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gemma4_calls_and_thought_channel() {
    let Some(t) = templates() else {
        return;
    };
    let dir = with_template(
        "gemma4",
        &t.join("google-gemma-4-31B-it.jinja"),
        "<|im_end|>",
    );
    let srv = start_with(&dir, 2, None, |a| a.ctx = Some(4096)).expect("server");
    let props = get(srv.addr, "/props");
    assert_eq!(props["tool_calls"], true, "{props}");
    assert_eq!(props["reasoning"], true, "{props}");
    forced_calls(srv.addr, json!({}));
    // With thinking on, the model opens the thought channel itself.
    let m = ask(
        srv.addr,
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 160,
                "temperature": 0.8, "seed": 2, "chat_template_kwargs": {"enable_thinking": true},
                "grammar": "start: \"<|channel>thought\\n\" /[a-z]{2,8}( [a-z]{2,8}){1,3}/ \"<channel|>\" /[a-z]{2,8}( [a-z]{2,8}){1,3}/\n"}),
    );
    assert!(!m.reasoning.is_empty() && !m.content.is_empty(), "{m:?}");
    assert!(
        !m.content.contains('<') && !m.reasoning.contains("channel"),
        "{m:?}"
    );
    let p = rendered(
        srv.addr,
        &json!({"messages": history(), "tools": [weather()]}),
    );
    assert!(
        p.contains(
            "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,unit:<|\"|>C<|\"|>}<tool_call|>"
        ),
        "{p}"
    );
    assert!(
        p.contains("<|tool_response>response:get_weather{value:<|\"|>-3 C<|\"|>}"),
        "{p}"
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
