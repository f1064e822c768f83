//! Prefix caching on the model families that need more than cached KV blocks: sliding-window
//! layers (Gemma 3, Gemma 4, which also shares KV between layers) and recurrent Gated DeltaNet
//! state (Qwen3.5, resumed from a snapshot). A second request with the same long prompt, over
//! real TCP: hits in /metrics and in `usage.prompt_tokens_details.cached_tokens`, only the
//! uncached tail computed, and the same tokens (and log-probabilities) as the first.

#[path = "common/server.rs"]
mod common;

use common::*;
use kiln_tests::{fixtures, model_file, GEMMA3};
use serde_json::{json, Value};

/// About 140 tokens for the fixtures' small vocabularies; with `MORE`, 80 for Gemma 3's.
const PROMPT: &str = "The old lighthouse keeper climbed the winding stairs every evening, \
    counting the steps as his father had, and lit the lamp that warned the fishing boats away \
    from the rocks below the cliff.";
const MORE: &str = " In winter the storms came early, and the spray froze on the windows of the \
    lantern room, so he scraped the glass with a borrowed kitchen knife and wrote the weather \
    in a ledger that nobody had read for forty years.";

fn same_prompt_twice(path: &std::path::Path, what: &str, prompt: &str) {
    let Some(srv) = start_model(path, 1, None) else {
        return;
    };
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1});
    let first = completion(srv.addr, &body);
    let before = metrics_text(srv.addr);
    let second = completion(srv.addr, &body);
    let after = metrics_text(srv.addr);
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let hits = delta("kiln_prefix_cache_hit_tokens_total");
    let computed = delta("kiln_tokens_computed_total");
    let prompt = second["usage"]["prompt_tokens"].as_f64().expect("usage");
    let generated = second["usage"]["completion_tokens"]
        .as_f64()
        .expect("usage");
    let cached = &second["usage"]["prompt_tokens_details"]["cached_tokens"];
    println!("{what}: prompt {prompt}, generated {generated}, cached {hits}, computed {computed}");
    assert!(prompt > 64.0, "{what}: the prompt is only {prompt} tokens");
    // Every full block but the one holding the last prompt token can come from the cache.
    assert!(
        hits >= prompt - 32.0,
        "{what}: only {hits} of {prompt} prompt tokens from the cache:\n{after}"
    );
    assert_eq!(cached.as_f64(), Some(hits), "{what}: {}", second["usage"]);
    assert_eq!(
        first["usage"]["prompt_tokens_details"]["cached_tokens"].as_f64(),
        Some(0.0)
    );
    // Only the uncached tail and the generated tokens (but the last) are computed.
    assert_eq!(computed, prompt - hits + generated - 1.0, "{what}");
    let text = |r: &Value| r["choices"][0]["text"].clone();
    assert_eq!(text(&second), text(&first), "{what}");
    let lps = |r: &Value| -> Vec<f64> {
        r["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .expect("token_logprobs")
            .iter()
            .map(|v| v.as_f64().expect("a log-probability"))
            .collect()
    };
    let (a, b) = (lps(&first), lps(&second));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() < 1e-4,
            "{what}: log-probabilities {a:?} vs {b:?}"
        );
    }
}

#[test]
fn qwen3_5_resumes_from_a_state_snapshot() {
    same_prompt_twice(&fixtures().join("hf/qwen3_5"), "qwen3_5", PROMPT);
    let Some(srv) = start_model(&fixtures().join("hf/qwen3_5"), 1, None) else {
        return;
    };
    completion(
        srv.addr,
        &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}),
    );
    let m = metrics_text(srv.addr);
    assert!(metric(&m, "kiln_state_snapshots") >= 1.0, "{m}");
    assert!(
        metric(&m, "kiln_state_snapshot_bytes") <= metric(&m, "kiln_state_snapshot_budget_bytes"),
        "{m}"
    );
}

#[test]
fn gemma4_keeps_the_sliding_window_blocks_a_cached_prefix_needs() {
    same_prompt_twice(&fixtures().join("hf/gemma4"), "gemma4", PROMPT);
}

#[test]
fn gemma3_270m_reuses_a_cached_prompt() {
    let Some(path) = model_file(GEMMA3) else {
        return;
    };
    same_prompt_twice(&path, "gemma3-270m", &format!("{PROMPT}{MORE}"));
}
