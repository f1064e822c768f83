//! `kiln serve`'s API beyond plain generation, end to end over real TCP: a shared prefix
//! served from the cache, /props, /slots and /metrics, `n` choices, log-probabilities checked
//! against the model, cancellation of a non-streaming client, and reasoning output.

#[path = "common/server.rs"]
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use kiln_core::engine::RunnerConfig;
use kiln_server::load::{load, ModelArgs};
use kiln_server::serve::state;
use kiln_tests::{model_file, SMOLLM2};
use serde_json::{json, Value};

/// Two requests sharing a long prefix, one after the other: the second's full prefix blocks
/// come from the cache (hits in /metrics) and it computes that many fewer tokens.
#[test]
fn a_shared_prefix_is_served_from_the_cache_with_hits_in_metrics() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let shared = "You are a careful assistant. Answer briefly and precisely, in plain English, \
                  without lists. Keep to the facts you are sure of and say so when unsure. ";
    let ask = |q: &str| {
        json!({"prompt": format!("{shared}Question: {q} Answer:"), "max_tokens": 4,
               "temperature": 0})
    };
    completion(srv.addr, &ask("what is the capital of France?"));
    let before = metrics_text(srv.addr);
    let r = completion(srv.addr, &ask("what is the boiling point of water?"));
    let after = metrics_text(srv.addr);
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let hits = delta("kiln_prefix_cache_hit_tokens_total");
    let computed = delta("kiln_tokens_computed_total");
    let prompt = r["usage"]["prompt_tokens"].as_f64().expect("usage");
    let generated = r["usage"]["completion_tokens"].as_f64().expect("usage");
    println!("prompt {prompt}, generated {generated}, reused {hits}, computed {computed}");
    // The shared text is over 32 tokens: at least two full 16-token blocks are reused.
    assert!(hits >= 32.0, "only {hits} tokens from the cache:\n{after}");
    // Every prompt token and every generated one but the last is fed once, cached or computed.
    assert_eq!(computed + hits, prompt + generated - 1.0);
    assert!(metric(&after, "kiln_prefix_cache_hit_rate") > 0.0);
}

/// Every request field either works or is refused by name: `logit_bias` bans and forces
/// tokens, `echo` prepends the prompt, and `response_format`, `suffix`, `best_of`, echo with
/// log-probabilities and image parts get a 400 naming the field.
#[test]
fn fields_work_or_are_refused_by_name() {
    let Some(srv) = start(1, None) else {
        return;
    };
    let prompt = "The capital of France is";
    let base = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0});
    let with = |extra: Value| {
        let mut b = base.clone();
        for (k, v) in extra.as_object().expect("an object") {
            b[k] = v.clone();
        }
        b
    };
    let plain = completion(srv.addr, &base);
    let text = |r: &Value| r["choices"][0]["text"].as_str().expect("text").to_string();
    // The first greedy token, by its id.
    let first = completion(srv.addr, &with(json!({"max_tokens": 1, "logprobs": 1})));
    let first_text = text(&first);
    let tok = srv
        .state
        .tokenizer
        .encode(&first_text, false)
        .expect("encode");
    assert_eq!(tok.len(), 1, "{first_text:?}");
    let banned = completion(
        srv.addr,
        &with(json!({"logit_bias": {tok[0].to_string(): -100}})),
    );
    assert!(!text(&banned).starts_with(&first_text), "{banned}");
    let forced_id = srv
        .state
        .tokenizer
        .encode(" banana", false)
        .expect("encode")[0];
    let forced = completion(
        srv.addr,
        &with(json!({"logit_bias": {forced_id.to_string(): 100}})),
    );
    let piece = srv.state.tokenizer.decode(&[forced_id]);
    assert_eq!(text(&forced), piece.repeat(3), "{forced}");
    // echo: the prompt, then the same completion.
    let echoed = completion(srv.addr, &with(json!({"echo": true})));
    assert_eq!(text(&echoed), format!("{prompt}{}", text(&plain)));
    let (st, body) = post(
        srv.addr,
        "/v1/completions",
        &with(json!({"echo": true, "stream": true})),
    );
    assert_eq!(st, 200);
    assert_eq!(streamed_text(&body), format!("{prompt}{}", text(&plain)));
    // response_format text is plain text.
    assert_eq!(
        text(&completion(
            srv.addr,
            &with(json!({"response_format": {"type": "text"}}))
        )),
        text(&plain)
    );
    for (extra, param) in [
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema",
                   "json_schema": {"schema": {"type": "object", "required": 5}}}}),
            "response_format",
        ),
        (json!({"grammar": "start: missing_rule"}), "grammar"),
        (
            json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}),
            "grammar",
        ),
        (json!({"suffix": "end"}), "suffix"),
        (json!({"best_of": 2}), "best_of"),
        (json!({"echo": true, "logprobs": 1}), "echo"),
        (json!({"logit_bias": {"999999999": 5}}), "logit_bias"),
        (json!({"logit_bias": {"1": 150}}), "logit_bias"),
    ] {
        let (st, body) = post(srv.addr, "/v1/completions", &with(extra.clone()));
        assert_eq!(st, 400, "{extra}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["error"]["param"], param, "{extra}: {body}");
    }
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    let (st, body) = post(srv.addr, "/v1/chat/completions", &image);
    assert_eq!(st, 400, "{body}");
    assert!(
        body.contains("not supported") || body.contains("only text"),
        "{body}"
    );
}

/// A chat template that does not compile costs the chat endpoint only: the server starts,
/// completions work, and chat requests get a 400 that says why.
#[test]
fn a_broken_chat_template_leaves_completions_working() {
    let tmp = std::env::temp_dir().join(format!("kiln-broken-template-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("tmp dir");
    let src = kiln_tests::fixtures().join("hf/llama");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), tmp.join(f)).expect("copy");
    }
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(src.join("tokenizer_config.json")).expect("tokenizer_config"),
    )
    .expect("JSON");
    cfg["chat_template"] = json!("{% for m in messages %}{{ m.content }");
    std::fs::write(tmp.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let Some(srv) = start_model(&tmp, 1, None) else {
        return;
    };
    let r = completion(srv.addr, &json!({"prompt": "hello", "max_tokens": 2}));
    assert!(r["choices"][0]["text"].is_string(), "{r}");
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (st, body) = post(srv.addr, "/v1/chat/completions", &chat);
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("does not compile"), "{body}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// /props describes the server; /slots shows a running request with the KV blocks it holds;
/// /metrics has the latency histograms and the outcome and status counters.
#[test]
fn props_slots_and_metrics_describe_the_server() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let props = get(srv.addr, "/props");
    assert_eq!(props["context_length"], 512, "{props}");
    assert_eq!(props["backend"], "cpu", "{props}");
    assert_eq!(props["kv_block_size"], 16, "{props}");
    assert_eq!(props["prefix_caching"], true, "{props}");
    assert!(props["chat_template"].is_string(), "{props}");
    let addr = srv.addr;
    let long = std::thread::spawn(move || {
        completion(
            addr,
            &json!({"prompt": "Tell me a long story about", "max_tokens": 60,
                    "temperature": 0}),
        )
    });
    let t0 = Instant::now();
    let seen = loop {
        let s = get(srv.addr, "/slots");
        if s["slots"].as_array().is_some_and(|v| !v.is_empty()) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no slot appeared");
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("{seen}");
    let slot = &seen["slots"][0];
    assert!(
        matches!(
            slot["state"].as_str(),
            Some("queued" | "prefill" | "decode")
        ),
        "{seen}"
    );
    let r = long.join().expect("client");
    assert_eq!(r["usage"]["completion_tokens"], 60, "{r}");
    let after = get(srv.addr, "/slots");
    assert_eq!(after["slots"], json!([]), "{after}");
    assert_eq!(after["kv_blocks"]["used"], 0, "{after}");
    // While running, the request held blocks for its tokens so far.
    if slot["state"] != "queued" {
        assert!(slot["kv_blocks"].as_u64() > Some(0), "{seen}");
    }
    let _ = post(srv.addr, "/v1/completions", &json!({"prompt": 5}));
    let m = metrics_text(srv.addr);
    assert!(metric(&m, "kiln_time_to_first_token_seconds_count") >= 1.0);
    assert!(metric(&m, "kiln_inter_token_latency_seconds_count") >= 59.0);
    assert!(metric(&m, "kiln_requests_total{status=\"length\"}") >= 1.0);
    assert!(metric(&m, "kiln_http_responses_total{code=\"200\"}") >= 1.0);
    assert_eq!(metric(&m, "kiln_http_responses_total{code=\"400\"}"), 1.0);
    assert!(metric(&m, "kiln_generation_tokens_total") >= 60.0);
}

/// `n` choices: greedy ones all equal the single answer; sampled ones are reproducible with a
/// seed; usage counts every choice.
#[test]
fn n_choices() {
    let Some(srv) = start(4, None) else {
        return;
    };
    let one = completion(
        srv.addr,
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}),
    );
    let three = completion(
        srv.addr,
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                "n": 3}),
    );
    let choices = three["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{three}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], one["choices"][0]["text"], "{three}");
    }
    assert_eq!(three["usage"]["completion_tokens"], 18, "{three}");
    let sampled = json!({"prompt": "My favourite food is", "max_tokens": 8,
                         "temperature": 1.0, "seed": 11, "n": 3});
    let a = completion(srv.addr, &sampled);
    let b = completion(srv.addr, &sampled);
    assert_eq!(
        a["choices"], b["choices"],
        "a seeded request is not reproducible"
    );
    // Streamed: every index appears, each ends once, and the texts are the whole ones.
    let mut body = sampled.clone();
    body["stream"] = json!(true);
    let (st, text) = post(srv.addr, "/v1/completions", &body);
    assert_eq!(st, 200, "{text}");
    let mut texts = vec![String::new(); 3];
    let mut ends = vec![0; 3];
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(d).expect("chunk");
        let c = &v["choices"][0];
        let i = c["index"].as_u64().expect("index") as usize;
        texts[i].push_str(c["text"].as_str().unwrap_or(""));
        ends[i] += usize::from(!c["finish_reason"].is_null());
    }
    assert_eq!(ends, vec![1, 1, 1], "{text}");
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(Some(t.as_str()), a["choices"][i]["text"].as_str());
    }
}

/// Log-probabilities: the first token's against the model's own logits computed separately
/// (a Runner and an f64 log-softmax), greedy tokens are their own top alternative, and the
/// token texts add up to the output.
#[test]
fn logprobs_match_the_model() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let path = model_file(SMOLLM2).expect("model");
    let file = kiln_core::load::gguf::GgufFile::open(&path).expect("model parses");
    let tok = kiln_core::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let prompt = "The capital of France is";
    let ids = tok.encode(prompt, true).expect("encode");
    let ex = kiln_core::exec::Executor::cpu();
    let model = kiln_core::model::build_from_gguf(&file, &ex).expect("model");
    let mut runner =
        kiln_core::engine::Runner::new(ex, model, RunnerConfig::default()).expect("runner");
    let logits = runner
        .feed(1, &ids, kiln_core::engine::Logits::Last)
        .expect("forward")
        .pop()
        .expect("a row");
    let lsm = kiln_core::sample::log_softmax(&logits);

    let r = completion(
        srv.addr,
        &json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3}),
    );
    let c = &r["choices"][0];
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token text"))
        .collect();
    assert_eq!(tokens.len(), 5, "{r}");
    assert_eq!(tokens.concat(), c["text"].as_str().expect("text"), "{r}");
    let first = tok.encode(tokens[0], false).expect("encode");
    let want = lsm[first[0] as usize];
    let got = lp["token_logprobs"][0].as_f64().expect("logprob");
    assert!(
        (got - want).abs() < 1e-3,
        "first token logprob {got} vs {want}"
    );
    for (i, top) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("a map");
        assert_eq!(top.len(), 3, "{r}");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().expect("logprob");
        assert!(
            (best - chosen).abs() < 1e-6,
            "greedy token {i} is not the most likely: {r}"
        );
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .expect("offsets")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{r}");

    // Chat, streamed and not: the same tokens, each greedy token its own best alternative.
    let chat = json!({"messages": [{"role": "user", "content": "Name a colour."}],
                      "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (st, text) = post(srv.addr, "/v1/chat/completions", &chat);
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .clone();
    assert_eq!(content.len(), 6, "{v}");
    for e in &content {
        let top = e["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert!(
            top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(),
            "{e}"
        );
        assert!(e["logprob"].as_f64().is_some_and(|l| l <= 0.0), "{e}");
        assert!(e["bytes"].is_array(), "{e}");
    }
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let (st, text) = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(st, 200, "{text}");
    let streamed: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .flat_map(|v| {
            v["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed, content);
}

/// A client that leaves before a non-streamed answer is complete: the request is cancelled
/// and its blocks return to the pool.
#[test]
fn a_non_streaming_client_that_leaves_is_cancelled() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let free = srv.state.engine.snapshot().kv_free;
    let body = json!({"prompt": "Tell me a long story about", "max_tokens": 400,
                      "temperature": 0})
    .to_string();
    let mut s = TcpStream::connect(srv.addr).expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let t0 = Instant::now();
    while srv.state.engine.snapshot().stats.generated < 3 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(s);
    loop {
        let snap = srv.state.engine.snapshot();
        if snap.slots.is_empty() && snap.kv_free == free {
            assert_eq!(snap.stats.cancelled, 1, "{snap:?}");
            assert!(snap.stats.generated < 400, "{snap:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the request was not cancelled: {snap:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A model whose chat template opens `<think>` on the assistant's turn (the tiny Qwen3.5
/// checkpoint with such a template): the answer arrives as `reasoning_content`, streamed and
/// not, equal to the raw text the completions endpoint gives for the same prompt, and /props
/// reports the syntax. (The parser itself is tested at every split point in
/// core/src/chat/parse.rs; this checks the server's plumbing around it.)
#[test]
fn a_thinking_template_turns_the_output_into_reasoning_content() {
    let src = kiln_tests::fixtures().join("hf").join("qwen3_5");
    let dir = std::env::temp_dir().join(format!("kiln-think-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copy");
    }
    let template = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if tools %}{{ '<tools>' }}{% for t in tools %}{{ t.function.name }}{% endfor %}{{ '</tools> answer with <tool_call>{json}</tool_call>' }}{% endif %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}";
    let cfg = json!({"eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let args = ModelArgs {
        ctx: Some(256),
        ..ModelArgs::new(Some(dir.display().to_string()), "cpu")
    };
    let cfg = RunnerConfig {
        max_seqs: 2,
        ..RunnerConfig::default()
    };
    let srv = serve(state(load(&args, cfg).expect("loads"), 2, None).expect("state"));
    let addr = srv.addr;

    let props = get(addr, "/props");
    assert_eq!(props["reasoning"], true, "{props}");
    assert_eq!(props["tool_calls"], true, "{props}");
    let chat = json!({"messages": [{"role": "user", "content": "Why is the sky blue?"}],
                      "max_tokens": 12, "temperature": 0});
    let (code, body) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"]
        .as_str()
        .expect("reasoning_content")
        .to_string();
    assert!(!reasoning.is_empty(), "{v}");
    assert_eq!(msg["content"], "", "{v}");
    // The same prompt as raw text through the completions endpoint.
    let raw = "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let c = completion(
        addr,
        &json!({"prompt": raw, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(c["choices"][0]["text"].as_str(), Some(reasoning.as_str()));
    // Streamed: reasoning deltas only, adding up to the same text.
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let (code, text) = post(addr, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{text}");
    let mut streamed = String::new();
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(d).expect("chunk");
        let delta = &v["choices"][0]["delta"];
        assert!(
            delta["content"].as_str().is_none_or(str::is_empty),
            "content in a reasoning stream: {d}"
        );
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, reasoning);
    // With tools offered, the template lists them (and a tool call would be parsed).
    let mut with_tools = chat.clone();
    with_tools["tools"] = json!([{"type": "function", "function": {"name": "sky_colour"}}]);
    let (code, body) = post(addr, "/v1/chat/completions", &with_tools);
    assert_eq!(code, 200, "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The gauges a router reads from a model server, by vLLM's names and labels: five long
/// requests on a server that runs two at a time read back as two running and three waiting,
/// the KV usage is the held share of the pool given on the same page, the cache config names
/// the pool's block size and blocks, and all of it reads zero when the server is idle.
#[test]
fn vllm_named_gauges_count_what_runs_and_waits() {
    let Some(srv) = start(2, None) else {
        return;
    };
    let model = srv.state.model.clone();
    let gauge = |m: &str, name: &str| metric(m, &format!("{name}{{model_name=\"{model}\"}}"));
    let idle = |m: &str| {
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
        ] {
            assert_eq!(gauge(m, name), 0.0, "{name}:\n{m}");
        }
    };
    let before = metrics_text(srv.addr);
    idle(&before);
    let snap = srv.state.engine.snapshot();
    assert_eq!(snap.kv_block_size, 16);
    let info = format!(
        "vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{}\",model_name=\"{model}\"}}",
        snap.kv_total
    );
    assert_eq!(metric(&before, &info), 1.0);

    let conns = long_streams(srv.addr, 5);
    let t0 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        if s.running == 2 && s.waiting == 3 && s.kv_free < s.kv_total {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never 2 + 3: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // 400 tokens a request: nothing finishes before the page is read.
    let m = metrics_text(srv.addr);
    assert_eq!(gauge(&m, "vllm:num_requests_running"), 2.0, "{m}");
    assert_eq!(gauge(&m, "vllm:num_requests_waiting"), 3.0, "{m}");
    assert_eq!(metric(&m, "kiln_requests_running"), 2.0);
    let usage = gauge(&m, "vllm:kv_cache_usage_perc");
    let (free, total) = (
        metric(&m, "kiln_kv_blocks_free"),
        metric(&m, "kiln_kv_blocks_total"),
    );
    assert!(usage > 0.0 && usage <= 1.0, "{usage}");
    assert!(
        (usage - (total - free) / total).abs() < 1e-12,
        "{usage} {free} {total}"
    );

    drop(conns);
    let t0 = Instant::now();
    loop {
        let s = srv.state.engine.snapshot();
        if s.running == 0 && s.waiting == 0 && s.kv_free == s.kv_total {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "still busy: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    idle(&metrics_text(srv.addr));
}
