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

/// A random JSON schema over a random `$ref` graph: chains, cycles, diamonds, refs to the
/// root, escaped and unresolvable pointers, nested `properties`/`items`/`anyOf`.
fn wild_schema(rng: &mut Rng) -> Value {
    // Mostly small graphs, one in eight past the depth limit.
    let most = if below(rng, 8) == 0 { 400 } else { 40 };
    let defs = 1 + below(rng, most);
    let target = |rng: &mut Rng| match below(rng, 12) {
        0 => "#".to_string(),
        1 => "#/nowhere".to_string(),
        2 => "http://example.com/s.json".to_string(),
        3 => "#/$defs/a~1b".to_string(),
        4 => "#/%24defs/d0".to_string(),
        _ => format!("#/$defs/d{}", below(rng, defs)),
    };
    let mut map = Map::new();
    for i in 0..defs {
        let mut node = json!({"$ref": target(rng)});
        for _ in 0..below(rng, 6) {
            node = match below(rng, 5) {
                0 => json!({"type": "object", "properties": {"p": node}}),
                1 => json!({"type": "array", "items": node}),
                2 => json!({"anyOf": [node, {"type": "null"}]}),
                3 => json!({"allOf": [node, {"$ref": target(rng)}]}),
                _ => json!({"properties": {"a": node, "b": {"$ref": target(rng)}}}),
            };
        }
        map.insert(format!("d{i}"), node);
    }
    map.insert("a/b".into(), json!({"type": "string"}));
    json!({"$defs": map, "$ref": target(rng)})
}

/// A random Lark grammar over a random rule graph, with embedded schemas and junk.
fn wild_lark(rng: &mut Rng) -> String {
    let most = if below(rng, 8) == 0 { 1500 } else { 60 };
    let rules = 1 + below(rng, most);
    let mut s = String::from("start: r0\n");
    for i in 0..rules {
        s.push_str(&format!("r{i}: "));
        for k in 0..1 + below(rng, 3) {
            if k > 0 {
                s.push_str(if below(rng, 2) == 0 { " | " } else { " " });
            }
            match below(rng, 10) {
                0 => s.push_str("\"x\""),
                1 => s.push_str("/[a-z]+/"),
                2 => s.push_str(&format!("%json {}", json!({"$ref": "#", "type": "object"}))),
                3 => s.push_str(&format!("(r{})*", below(rng, rules))),
                4 => s.push_str("<|junk|>"),
                5 => s.push_str("\"y\"{2,5}"),
                6 => s.push_str(&format!("r{}", i + 1)),
                _ => s.push_str(&format!("r{}", below(rng, rules))),
            }
        }
        s.push('\n');
    }
    s.push_str(&format!("r{rules}: \"end\"\n"));
    s
}

/// Schemas and grammars with deep and tangled references compile or are refused — never a
/// panic, and never the stack overflow that aborts the process (which would end this test
/// binary: a crash). `KILN_FUZZ_ITERS` inputs (each half schemas, half grammars).
#[test]
fn schemas_and_grammars_with_deep_references_compile_or_are_refused() {
    use kiln_core::grammar::{GrammarSpec, Grammars};
    let tok = Tokenizer::from_hf_file(&fixtures().join("hf/llama/tokenizer.json")).expect("tok");
    let g = Grammars::new(&tok, tok.vocab_size()).expect("grammars");
    let mut rng = Rng::new(36);
    let n = iters(40);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..n {
        let spec = if i % 2 == 0 {
            GrammarSpec::JsonSchema(wild_schema(&mut rng))
        } else {
            GrammarSpec::Lark(wild_lark(&mut rng))
        };
        let r = catch_unwind(AssertUnwindSafe(|| g.compile(&spec).is_ok()));
        match r {
            Ok(true) => ok += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!("a panic on input {i}: {spec:?}"),
        }
        if (i + 1) % 50_000 == 0 {
            println!("{} inputs: {ok} compiled, {refused} refused", i + 1);
        }
    }
    println!("{n} schemas and grammars: {ok} compiled, {refused} refused");
}

/// Templates that loop, grow, recurse and repeat, rendered in the sandbox under small
/// limits: each ends in a prompt or an error within its deadline, and no render child is
/// left behind.
#[cfg(unix)]
#[test]
fn hostile_chat_templates_end_within_their_limits() {
    use kiln_core::chat::{RenderError, RenderLimits};
    use std::time::{Duration, Instant};
    const LEAVES: &[&str] = &[
        "{% set ns.s = ns.s ~ ns.s %}",
        "{{ ns.s | length }}",
        "{{ 'x' * 100000000 }}",
        "{{ messages * 100000 }}",
        "{{ (messages | tojson) * 1000 }}",
        "{{ range(100000) | join(',') }}",
        "{{ 'y' | center(1000000000) }}",
        "{{ f('a') }}",
        "{{ m.content }}",
        "{{ raise_exception('no') }}",
        "{{ ns.s ~ ns.s ~ ns.s }}",
        "text ",
    ];
    const OPENS: &[(&str, &str)] = &[
        ("{% for i in range(100000) %}", "{% endfor %}"),
        ("{% for m in messages %}", "{% endfor %}"),
        ("{% if add_generation_prompt %}", "{% endif %}"),
        ("{% for j in range(1000) %}", "{% endfor %}"),
    ];
    /// A balanced block of up to `depth` nested loops and conditions.
    fn block(rng: &mut Rng, depth: usize, out: &mut String) {
        for _ in 0..1 + below(rng, 3) {
            if depth > 0 && below(rng, 2) == 0 {
                let (open, close) = OPENS[below(rng, OPENS.len())];
                out.push_str(open);
                block(rng, depth - 1, out);
                out.push_str(close);
            } else {
                out.push_str(LEAVES[below(rng, LEAVES.len())]);
            }
        }
    }
    // Small limits, so that an input that reaches one costs milliseconds.
    let limits = RenderLimits {
        fuel: 500_000,
        max_output: 1 << 20,
        max_memory: 16 << 20,
        // `KILN_FUZZ_TEMPLATE_MS` shortens the deadline for long runs by hand: the inputs that
        // reach it are a tenth of all and each holds a core until it.
        timeout: Duration::from_millis(
            std::env::var("KILN_FUZZ_TEMPLATE_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(150),
        ),
    };
    let messages = vec![json!({"role": "user", "content": "hi"})];
    let n = iters(40);
    // Renders run side by side in the sandbox (`KILN_FUZZ_THREADS` callers, default 2): the
    // concurrent path is exercised too, and waits at the deadlines overlap.
    let threads: usize = std::env::var("KILN_FUZZ_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(1);
    // Another seed (`KILN_FUZZ_SEED`) gives other inputs to a run that continues an earlier one.
    let seed: u64 = std::env::var("KILN_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(37);
    let outcomes = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (outcomes, done, messages, limits) = (&outcomes, &done, &messages, &limits);
            scope.spawn(move || {
                let mut rng = Rng::new(seed + t as u64);
                for i in (t..n).step_by(threads) {
                    let mut src = String::from(
                        "{% set ns = namespace(s='ab') %}{% macro f(x) %}{{ f(x ~ x) }}{% endmacro %}",
                    );
                    block(&mut rng, 3, &mut src);
                    let kind = match ChatTemplate::sandboxed(&src, "<s>", "</s>", limits) {
                        Err(_) => "does not compile",
                        Ok(tpl) => {
                            let t0 = Instant::now();
                            let r = catch_unwind(AssertUnwindSafe(|| {
                                tpl.render_limited(messages, None, true, &Map::new(), limits, &|| false)
                            }));
                            let took = t0.elapsed();
                            assert!(
                                took < Duration::from_secs(3),
                                "input {i} took {took:?}: {src}"
                            );
                            match r {
                                Ok(Ok(_)) => "ok",
                                Ok(Err(RenderError::Limit(l, _))) => l.name(),
                                Ok(Err(RenderError::Template(_))) => "error",
                                Ok(Err(e)) => panic!("input {i}: {e}: {src}"),
                                Err(_) => panic!("a panic on input {i}: {src}"),
                            }
                        }
                    };
                    let mut o = outcomes.lock().unwrap_or_else(|e| e.into_inner());
                    *o.entry(kind).or_insert(0) += 1;
                    let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if d % 1000 == 0 {
                        println!("{d} inputs: {o:?}");
                    }
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    println!("{n} hostile templates: {outcomes:?}");
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
        vision: None,
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

/// Small valid PNG, JPEG and WebP files of random pixels: the seeds of the image target.
fn image_seeds(rng: &mut Rng) -> Vec<Vec<u8>> {
    use image::ImageFormat;
    let mut out = Vec::new();
    for (fmt, alpha) in [
        (ImageFormat::Png, false),
        (ImageFormat::Png, true),
        (ImageFormat::Jpeg, false),
        (ImageFormat::WebP, true),
    ] {
        let (w, h) = (1 + below(rng, 40) as u32, 1 + below(rng, 40) as u32);
        let ch = if alpha { 4 } else { 3 };
        let px: Vec<u8> = (0..w * h * ch).map(|_| rng.next_u64() as u8).collect();
        let img = match alpha {
            true => {
                image::DynamicImage::ImageRgba8(image::RgbaImage::from_raw(w, h, px).expect("rgba"))
            }
            false => {
                image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, px).expect("rgb"))
            }
        };
        let mut bytes = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut bytes), fmt)
            .expect("encode");
        out.push(bytes);
    }
    out
}

/// Hostile images (truncated, bit-flipped, spliced, with headers claiming huge sizes, or
/// noise) through decoding and the image processor: an image or an error, never a panic,
/// and no decode past the pixel budget. CI runs a few hundred; by hand
/// `KILN_FUZZ_ITERS=100000 cargo test --release -p kiln-tests --test fuzz images`.
#[test]
fn hostile_images_are_errors_not_panics() {
    use kiln_core::vision::{resize::Filter, Image, Processor, MAX_PIXELS};
    let mut rng = Rng::new(0x1a6e);
    let seeds = image_seeds(&mut rng);
    let proc = Processor {
        size: Some((32, 32)),
        fit: None,
        area: None,
        filter: Filter::Bicubic,
        rescale: Some(1.0 / 255.0),
        normalize: Some(([0.5; 3], [0.5; 3])),
    };
    // Qwen's dynamic resize (a pixel range; extreme aspect ratios refused), every other image.
    let dynamic = Processor {
        size: None,
        area: Some(kiln_core::vision::Area {
            unit: 32,
            min_pixels: 8 * 32 * 32,
            max_pixels: 256 * 32 * 32,
        }),
        ..proc.clone()
    };
    let n = iters(400);
    let mut decoded = 0;
    for i in 0..n {
        let mut b = seeds[i % seeds.len()].clone();
        match below(&mut rng, 6) {
            0 => b.truncate(below(&mut rng, b.len() + 1)),
            1 => {
                for _ in 0..1 + below(&mut rng, 8) {
                    let at = below(&mut rng, b.len());
                    b[at] ^= 1 << below(&mut rng, 8);
                }
            }
            2 => {
                // A run of bytes set to 0xff: sizes and lengths in headers turn huge.
                let at = below(&mut rng, b.len());
                let end = (at + 1 + below(&mut rng, 8)).min(b.len());
                b[at..end].fill(0xff);
            }
            3 => {
                let other = &seeds[below(&mut rng, seeds.len())];
                let cut = below(&mut rng, b.len().min(other.len()));
                b.truncate(cut);
                b.extend_from_slice(&other[cut..]);
            }
            4 => {
                let keep = below(&mut rng, 16).min(b.len());
                b.truncate(keep);
                b.extend((0..below(&mut rng, 200)).map(|_| rng.next_u64() as u8));
            }
            _ => {}
        }
        let r = catch_unwind(AssertUnwindSafe(|| match Image::decode(&b) {
            Ok(img) => {
                assert!((img.rgb.width * img.rgb.height) as u64 <= MAX_PIXELS);
                let p = if i % 2 == 0 { &proc } else { &dynamic };
                p.pixels(&img.rgb).map(|_| true).unwrap_or(false)
            }
            Err(_) => false,
        }));
        match r {
            Ok(ok) => decoded += ok as usize,
            Err(_) => panic!("a panic on image input {i} ({} bytes)", b.len()),
        }
    }
    println!("{n} hostile images: {decoded} decoded, the rest refused");
    assert!(decoded > 0, "the unmutated seeds decode");
}
