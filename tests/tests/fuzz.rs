//! Property tests over what comes from outside: mutated safetensors headers, mutated
//! `config.json` values, mutated `tokenizer.json` files, generated chat templates and random
//! request JSON. Each input must give a value or an error, never a panic. CI runs a few
//! hundred inputs per target; `KILN_FUZZ_ITERS=1000000 cargo test -p kiln-tests --test fuzz
//! --release` runs them by hand.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use kiln_core::chat::{ChatTemplate, Message};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::rng::Rng;
use kiln_core::tokenizer::Tokenizer;
use kiln_tests::fixtures;
use serde_json::{json, Map, Value};

/// Inputs per target: `KILN_FUZZ_ITERS`, else `ci`.
fn iters(ci: usize) -> usize {
    std::env::var("KILN_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci)
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// A scratch copy of the llama fixture directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let src = fixtures().join("hf/llama");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copy");
    }
    dir
}

/// Opens and builds the model in `dir`; a panic fails the test with `what`.
fn load_never_panics(dir: &Path, what: &str) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if let Ok(f) = open_model(dir) {
            let _ = build_from_gguf(&f, &Executor::cpu());
        }
    }));
    assert!(r.is_ok(), "a panic on {what}");
}

/// A random JSON value of small depth: the kinds of values that break loaders.
fn wild_value(rng: &mut Rng, depth: usize) -> Value {
    let choices = if depth == 0 { 9 } else { 11 };
    match below(rng, choices) {
        0 => Value::Null,
        1 => json!(below(rng, 2) == 1),
        2 => json!(0),
        3 => json!(-1 - below(rng, 100) as i64),
        4 => json!(u64::MAX),
        5 => json!(1u64 << (below(rng, 63) as u32)),
        6 => json!((rng.next_u64() as f64) / 1e9 - 9e9),
        7 => json!(["x", "y", "z"][below(rng, 3)]),
        8 => json!(below(rng, 300)),
        9 => Value::Array(
            (0..below(rng, 4))
                .map(|_| wild_value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..below(rng, 3) {
                m.insert(format!("k{}", below(rng, 5)), wild_value(rng, depth - 1));
            }
            Value::Object(m)
        }
    }
}

#[test]
fn mutated_safetensors_headers_are_errors_not_panics() {
    let dir = scratch("safetensors");
    let good = std::fs::read(dir.join("model.safetensors")).expect("weights");
    let header_len = u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let mut rng = Rng::new(1);
    let n = iters(300);
    for i in 0..n {
        let mut bytes = good.clone();
        match below(&mut rng, 4) {
            // Bytes of the length field or the JSON header.
            0 | 1 => {
                for _ in 0..1 + below(&mut rng, 4) {
                    let at = below(&mut rng, 8 + header_len);
                    bytes[at] = rng.next_u64() as u8;
                }
            }
            // A digit of the header changed (offsets, shapes).
            2 => {
                let digits: Vec<usize> = (8..8 + header_len)
                    .filter(|&j| bytes[j].is_ascii_digit())
                    .collect();
                let at = digits[below(&mut rng, digits.len())];
                bytes[at] = b'0' + below(&mut rng, 10) as u8;
            }
            // Truncated anywhere.
            _ => bytes.truncate(below(&mut rng, bytes.len())),
        }
        std::fs::write(dir.join("model.safetensors"), &bytes).expect("write");
        load_never_panics(&dir, &format!("safetensors mutation {i}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{n} mutated safetensors files");
}

#[test]
fn wild_config_values_are_errors_not_panics() {
    let dir = scratch("config");
    let good: Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("JSON");
    let keys: Vec<String> = good.keys().cloned().collect();
    let mut rng = Rng::new(2);
    let n = iters(300);
    for i in 0..n {
        let mut cfg = good.clone();
        for _ in 0..1 + below(&mut rng, 3) {
            let k = &keys[below(&mut rng, keys.len())];
            if below(&mut rng, 5) == 0 {
                cfg.remove(k);
            } else {
                cfg.insert(k.clone(), wild_value(&mut rng, 2));
            }
        }
        let text = Value::Object(cfg).to_string();
        std::fs::write(dir.join("config.json"), &text).expect("write");
        load_never_panics(&dir, &format!("config {i}: {text}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{n} wild config.json files");
}

#[test]
fn mutated_tokenizer_files_are_errors_not_panics() {
    let dir = scratch("tokenizer");
    let good = std::fs::read(dir.join("tokenizer.json")).expect("tokenizer");
    let mut rng = Rng::new(3);
    let n = iters(300);
    for i in 0..n {
        let mut bytes = good.clone();
        if below(&mut rng, 3) == 0 {
            bytes.truncate(below(&mut rng, bytes.len()));
        } else {
            for _ in 0..1 + below(&mut rng, 6) {
                let at = below(&mut rng, bytes.len());
                bytes[at] = b"0123456789{}[]\":, -.aZ\\"[below(&mut rng, 23)];
            }
        }
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, &bytes).expect("write");
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(t) = Tokenizer::from_hf_file(&path) {
                if let Ok(ids) = t.encode("Hello, world! 123 ünïcødé", true) {
                    let _ = t.decode(&ids);
                }
            }
        }));
        assert!(r.is_ok(), "a panic on tokenizer mutation {i}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{n} mutated tokenizer.json files");
}

#[test]
fn generated_chat_templates_are_errors_not_panics() {
    const PIECES: &[&str] = &[
        "{% for m in messages %}",
        "{% endfor %}",
        "{% if add_generation_prompt %}",
        "{% endif %}",
        "{{ m.content }}",
        "{{ m['role'] }}",
        "{{ messages[0].content | trim }}",
        "{{ bos_token }}",
        "{{ raise_exception('no') }}",
        "{{ m.content.split('x')[5] }}",
        "{% set ns = namespace(a=1) %}",
        "{{ ns.a / 0 }}",
        "{{ tools | tojson }}",
        "{{ messages | length }}",
        "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
        "<|im_start|>",
        "{{",
        "}}",
        "{%",
        "text ",
    ];
    let mut rng = Rng::new(4);
    let n = iters(500);
    let messages = vec![
        Message::new("system", "be brief"),
        Message::new("user", "hi"),
    ];
    for i in 0..n {
        let src: String = (0..1 + below(&mut rng, 8))
            .map(|_| PIECES[below(&mut rng, PIECES.len())])
            .collect();
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>") {
                let _ = t.render(&messages, true);
            }
        }));
        assert!(r.is_ok(), "a panic on template {i}: {src}");
    }
    println!("{n} generated chat templates");
}

#[test]
fn random_request_json_is_a_value_or_an_error_not_a_panic() {
    use kiln_server::serve::request::{
        body_json, chat_prompt, common, completion_prompt, constrain, Kind,
    };
    let dir = fixtures().join("hf/llama");
    let file = open_model(&dir).expect("fixture");
    let tokenizer = kiln_core::tokenizer::open_tokenizer(&dir, &file).expect("tokenizer");
    let ex = Executor::cpu();
    let model = build_from_gguf(&file, &ex).expect("model");
    let runner = kiln_core::engine::Runner::new(ex, model, Default::default()).expect("runner");
    let loaded = kiln_server::load::Loaded {
        path: dir.clone(),
        file,
        tokenizer,
        runner,
    };
    let state = kiln_server::serve::state(loaded, 1, None).expect("state");
    const FIELDS: &[&str] = &[
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "stop",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "seed",
        "logit_bias",
        "echo",
        "suffix",
        "best_of",
        "response_format",
        "tools",
        "tool_choice",
        "presence_penalty",
        "frequency_penalty",
        "ignore_eos",
        "grammar",
        "chat_template_kwargs",
        "parallel_tool_calls",
    ];
    let mut rng = Rng::new(5);
    let n = iters(2000);
    for i in 0..n {
        let mut b = Map::new();
        if below(&mut rng, 2) == 0 {
            b.insert("prompt".into(), json!("Hello"));
        } else {
            b.insert(
                "messages".into(),
                json!([{"role": "user", "content": "Hello"}]),
            );
        }
        for _ in 0..below(&mut rng, 5) {
            let f = FIELDS[below(&mut rng, FIELDS.len())];
            b.insert(f.into(), wild_value(&mut rng, 2));
        }
        let text = Value::Object(b).to_string();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let Ok(b) = body_json(text.as_bytes()) else {
                return;
            };
            if let Ok(p) = completion_prompt(&state, &b) {
                if let Ok(mut spec) = common(&state, Kind::Text, &b, p, 16) {
                    let _ = constrain(&state, &mut spec);
                }
            }
            if let Ok(c) = chat_prompt(&state, &b) {
                if let Ok(mut spec) = common(&state, Kind::Chat, &b, c.ids, 16) {
                    spec.grammar = spec.grammar.or(c.grammar);
                    let _ = constrain(&state, &mut spec);
                }
            }
        }));
        assert!(r.is_ok(), "a panic on request {i}: {text}");
    }
    println!("{n} random requests");
}
