//! Real GGUF models on the CPU against llama.cpp (commit 0c1e570): greedy continuations and
//! perplexity. The reference data and how it was made are in fixtures/llamacpp/.

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
use kiln_core::sample::argmax;
use kiln_core::tensor::DType;
use kiln_core::tokenizer::Tokenizer;
use kiln_tests::{fixtures, model_file, GEMMA3, SMOLLM2};
use serde_json::Value;

fn load(name: &str, batch: usize) -> Option<(Tokenizer, Runner)> {
    let path = model_file(name)?;
    let file = GgufFile::open(&path).expect("model parses");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer loads");
    let ex = Executor::cpu();
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 1024,
        max_batch_tokens: batch,
        ..RunnerConfig::default()
    };
    Some((tok, Runner::new(ex, model, cfg).expect("runner")))
}

fn fixture(name: &str) -> Value {
    let p = fixtures().join("llamacpp").join(name);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// How one prompt's greedy continuation compared with llama.cpp's.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// All steps equal.
    Match,
    /// Equal up to a step where llama.cpp's own top two were within 0.1 nats and kiln took
    /// its second choice (NOTES.md: llama.cpp disagrees with itself at such steps).
    NearTie { step: usize, gap: f64 },
    /// A real difference: kiln chose another token where llama.cpp was not near a tie.
    Differs {
        step: usize,
        gap: f64,
        kiln: u32,
        llama: u32,
    },
}

/// Greedy decoding from llama.cpp's prompt ids, compared step by step; comparison of a prompt
/// stops at its first difference.
fn greedy_vs_llama_cpp(model: &str, fixture_name: &str) -> Option<Vec<(String, Outcome)>> {
    let (tok, mut runner) = load(model, 256)?;
    let cases = fixture(fixture_name);
    let cases = cases.as_array().expect("list of prompts");
    let mut out = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let prompt = case["prompt"].as_str().expect("prompt");
        let prompt_ids = ids(&case["prompt_ids"]);
        assert_eq!(
            tok.encode(prompt, true).expect("encode"),
            prompt_ids,
            "prompt ids of {prompt:?}"
        );
        let want = ids(&case["tokens"]);
        let top = case["top"].as_array().expect("top-5 per step");
        let seq = ci as u64 + 1;
        let mut logits = runner
            .feed(seq, &prompt_ids, Logits::Last)
            .expect("prefill")
            .pop()
            .expect("logits");
        let mut outcome = Outcome::Match;
        for (step, &w) in want.iter().enumerate() {
            // The references were made with llama.cpp's ignore_eos, which masks every
            // end-of-generation token.
            for &e in tok.eog_ids() {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            let got = argmax(&logits);
            if got != w {
                let alts = top[step].as_array().expect("top list");
                let lp = |i: usize| alts[i][1].as_f64().expect("logprob");
                let second = alts[1][0].as_u64().expect("id") as u32;
                let gap = lp(0) - lp(1);
                outcome = if gap < 0.1 && got == second {
                    Outcome::NearTie { step, gap }
                } else {
                    Outcome::Differs {
                        step,
                        gap,
                        kiln: got,
                        llama: w,
                    }
                };
                break;
            }
            if step + 1 < want.len() {
                logits = runner
                    .feed(seq, &[w], Logits::Last)
                    .expect("decode")
                    .pop()
                    .expect("logits");
            }
        }
        println!("{model} prompt {ci} {prompt:?}: {outcome:?}");
        runner.release(seq).expect("release");
        out.push((prompt.to_string(), outcome));
    }
    Some(out)
}

/// At least four prompts per model must agree with llama.cpp over all 48 tokens (or up to a
/// near-tie). Real differences elsewhere are printed: kiln's CPU reference computes in f32
/// and matches an independent f64 implementation to ~1e-5 (see the issue note), while
/// llama.cpp rounds activations to 8 bits and attention to f16, which moves log-probabilities
/// by up to a few tenths of a nat over a long continuation.
fn greedy_matches_llama_cpp(model: &str, fixture_name: &str) {
    let Some(results) = greedy_vs_llama_cpp(model, fixture_name) else {
        return;
    };
    let agree = results
        .iter()
        .filter(|r| !matches!(r.1, Outcome::Differs { .. }))
        .count();
    println!(
        "{model}: {agree} of {} prompts agree with llama.cpp",
        results.len()
    );
    assert!(
        agree >= 4,
        "{model}: only {agree} prompts agree with llama.cpp: {results:?}"
    );
}

#[test]
fn smollm2_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(SMOLLM2, "greedy_smollm2.json");
}

#[test]
fn gemma3_greedy_matches_llama_cpp() {
    greedy_matches_llama_cpp(GEMMA3, "greedy_gemma3.json");
}

/// Perplexity over the first chunks of the text, against llama.cpp's running estimate after
/// the same number of chunks (the whole text is compared by `kiln perplexity`; see the issue
/// note). Within 1%.
fn perplexity_matches_llama_cpp(model: &str, fixture_name: &str, chunks: usize) {
    let Some((tok, mut runner)) = load(model, 128) else {
        return;
    };
    let f = fixture(fixture_name);
    let ctx = f["ctx"].as_u64().expect("ctx") as usize;
    let per_chunk = f["per_chunk"].as_array().expect("running estimates");
    let text = std::fs::read_to_string(fixtures().join("text").join("ppl.txt")).expect("text");
    let text = kiln_server::generate::perplexity_text(&text);
    let tokens = tok.encode(&text, true).expect("encode");
    assert_eq!(
        tokens.len() as u64,
        f["tokens"].as_u64().expect("token count"),
        "tokenized length differs from llama.cpp's"
    );
    let n = chunks.min(per_chunk.len());
    let (ppl, done) = kiln_server::generate::perplexity_of(
        &mut runner,
        &tok,
        &tokens,
        ctx,
        Some(n),
        |_, _, _| {},
    )
    .expect("perplexity");
    assert_eq!(done, n);
    let want = per_chunk[n - 1].as_f64().expect("ppl");
    let rel = (ppl - want).abs() / want;
    println!(
        "{model}: ppl over {n} chunks of {ctx}: kiln {ppl:.4}, llama.cpp {want:.4} ({:.3}%)",
        rel * 100.0
    );
    assert!(
        rel < 0.01,
        "{model}: perplexity {ppl:.4} vs llama.cpp {want:.4}"
    );
}

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    perplexity_matches_llama_cpp(SMOLLM2, "ppl_smollm2.json", 24);
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    perplexity_matches_llama_cpp(GEMMA3, "ppl_gemma3.json", 24);
}

/// `kiln perplexity --save-base` / `--compare` on a real model: a run compared with its own
/// base shows no change; a q8_0-cache run's per-position figures add up to the change of the
/// two perplexities that `perplexity_of` computes on its own.
#[test]
fn smollm2_compare_with_a_saved_base() {
    use kiln_server::kld::{record, Stats};
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let file = GgufFile::open(&path).expect("model parses");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer loads");
    let runner = |kv: DType| {
        let ex = Executor::cpu();
        let model = build_from_gguf(&file, &ex).expect("model builds");
        let cfg = RunnerConfig {
            ctx: 256,
            max_batch_tokens: 128,
            kv_types: kiln_core::kv::KvTypes::uniform(kv),
            ..RunnerConfig::default()
        };
        Runner::new(ex, model, cfg).expect("runner")
    };
    let text = std::fs::read_to_string(fixtures().join("text").join("ppl.txt")).expect("text");
    let tokens = tok
        .encode(&kiln_server::generate::perplexity_text(&text), true)
        .expect("encode");
    let ctx = 128;
    // A run with the cache type `kv`, handing every scored position to `each`.
    let score = |kv: DType, each: &mut dyn FnMut(&[f64], u32)| {
        kiln_server::generate::perplexity_with(
            &mut runner(kv),
            &tok,
            &tokens,
            ctx,
            Some(2),
            |_, _, _| {},
            |lp, next| {
                each(lp, next);
                Ok(())
            },
        )
        .expect("perplexity")
        .0
    };
    let mut base = Vec::new();
    let ppl_base = score(DType::F32, &mut |lp, next| base.push(record(lp, next)));
    assert_eq!(base.len(), 2 * (ctx - 1 - ctx / 2));
    for kv in [DType::F32, DType::Q8_0] {
        let (mut st, mut at) = (Stats::new(ctx - 1 - ctx / 2), 0);
        let ppl = score(kv, &mut |lp, next| {
            assert_eq!(base[at].token, next);
            st.add(&base[at], lp);
            at += 1;
        });
        let s = st.summary();
        println!("{kv:?} cache against f32:\n{s}");
        assert_eq!(s.n, base.len());
        assert!(s.ln_ratio_se_chunks.is_some(), "{s}");
        assert!((s.ln_ratio - (ppl / ppl_base).ln()).abs() < 1e-5, "{s}");
        if kv == DType::F32 {
            assert_eq!(s.same_top, 1.0, "{s}");
            assert!(s.kl_max < 1e-6, "{s}");
        } else {
            assert!(s.kl_mean > 0.0 && s.kl_mean < 0.05, "{s}");
            assert!(s.same_top > 0.9, "{s}");
        }
    }
}

/// Chunked prefill and token-by-token decode give the same logits as one big prefill, and a
/// sliding-window model that runs past its window releases blocks.
#[test]
fn chunked_prefill_equals_one_pass() {
    let Some((_, mut one)) = load(SMOLLM2, 256) else {
        return;
    };
    let Some((_, mut chunked)) = load(SMOLLM2, 7) else {
        return;
    };
    let mut rng = kiln_core::rng::Rng::new(5);
    let toks: Vec<u32> = (0..40).map(|_| rng.below(49152) as u32).collect();
    let a = one.feed(1, &toks, Logits::All).expect("one pass");
    let b = chunked.feed(1, &toks, Logits::All).expect("chunked");
    assert_eq!(a.len(), 40);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let m = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(m < 1e-3, "row {i}: max abs diff {m}");
    }
}

/// Gemma 3's sliding-window layers (window 512) release the blocks that fall out of the
/// window while a long prompt is fed in chunks, and the logits still equal a single pass that
/// released nothing.
#[test]
fn gemma3_sliding_window_releases_blocks_and_keeps_the_logits() {
    let Some((_, mut one)) = load(GEMMA3, 600) else {
        return;
    };
    let Some((_, mut chunked)) = load(GEMMA3, 64) else {
        return;
    };
    let mut rng = kiln_core::rng::Rng::new(9);
    let toks: Vec<u32> = (0..600).map(|_| 3 + rng.below(200_000) as u32).collect();
    let a = one.feed(1, &toks, Logits::Last).expect("one pass");
    let b = chunked.feed(1, &toks, Logits::Last).expect("chunked");
    let groups = chunked.model().kv_groups().to_vec();
    let swa = groups
        .iter()
        .position(|g| g.window == Some(512))
        .expect("a sliding-window group");
    let table = chunked.kv_managers()[swa]
        .block_table(1)
        .expect("table")
        .to_vec();
    let released = table.iter().filter(|&&b| b == 0).count();
    // 600 tokens, window 512: blocks wholly before position 88 (5 of 16 tokens) are released.
    assert_eq!(released, (600 - 512) / 16, "released blocks in {table:?}");
    let full = groups
        .iter()
        .position(|g| g.window.is_none())
        .expect("a full group");
    assert!(chunked.kv_managers()[full]
        .block_table(1)
        .expect("table")
        .iter()
        .all(|&b| b != 0));
    let m = a[0]
        .iter()
        .zip(&b[0])
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max);
    assert!(m < 1e-3, "last-position logits differ by {m}");
}
