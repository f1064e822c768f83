//! Keys fitted to the queries (`--kv-fit-keys`, `core/src/kv/key_fit.rs`): every layer's keys
//! are stored as `T·k` and its queries scored as `T⁻ᵀ·q`, so the scores are the model's own;
//! only where the lossy cache rounds moves. On a random-weight Llama checkpoint the logits
//! with a q8_0 K cache, fitted or not, stay as close to the f32 cache's as q8_0's rounding
//! allows (a wrong query map, `T` in place of `T⁻ᵀ`, moves them hundreds of times further), and
//! the fitted runner decodes and prefills alike.

use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::engine::{Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::kv::KvTypes;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::tensor::DType;
use kiln_tests::{fixtures, greedy_logits};

fn runner(k: DType, fit: bool, center: bool) -> Runner {
    let path = fixtures().join("hf/gguf/llama_q4_k.gguf");
    let file = open_model(&path).expect("checkpoint opens");
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1));
    let ex = Executor::new(cpu);
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let mut kv_types = KvTypes::uniform(DType::F32);
    kv_types.k = k;
    let cfg = RunnerConfig {
        max_batch_tokens: 64,
        block_size: 4,
        kv_types,
        kv_fit_keys: fit,
        kv_center_keys: center,
        // A calibration text in the checkpoint's 320-token vocabulary.
        kv_calibration: (0..60u32).map(|i| (i * 37 + 11) % 320).collect(),
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

const PROMPT: [u32; 12] = [259, 283, 81, 223, 89, 81, 84, 78, 70, 12, 140, 301];

#[test]
fn fitted_keys_keep_the_scores() {
    let (_, want) = greedy_logits(&mut runner(DType::F32, false, false), &PROMPT, 8);
    let spread = want.iter().flatten().fold(0.0f32, |m, x| m.max(x.abs()));
    let mut plain = runner(DType::Q8_0, false, false);
    assert!(!plain.caches().keys_fitted());
    let (_, q8) = greedy_logits(&mut plain, &PROMPT, 8);
    let mut fitted = runner(DType::Q8_0, true, false);
    assert!(fitted.caches().keys_fitted(), "a lossy K cache gets a map");
    let (_, q8_fit) = greedy_logits(&mut fitted, &PROMPT, 8);
    let (e_plain, e_fit) = (max_diff(&want, &q8), max_diff(&want, &q8_fit));
    println!("largest logit {spread:.3}; q8_0 K from f32: {e_plain:.2e}, fitted {e_fit:.2e}");
    assert!(e_plain > 0.0 && e_plain < 0.02 * spread);
    // Attention moves this checkpoint's logits little, so the bound is q8_0's own error: a
    // query map that is not T⁻ᵀ (T itself) moved them 600 times further.
    assert!(
        e_fit < 50.0 * e_plain.max(1e-6),
        "fitted q8_0 keys moved the logits by {e_fit}, plain ones by {e_plain}"
    );
    // Asked for both, the same (fitted keys are centered anyway).
    let (_, both) = greedy_logits(&mut runner(DType::Q8_0, true, true), &PROMPT, 8);
    assert!(max_diff(&want, &both) < 50.0 * e_plain.max(1e-6));
}

#[test]
fn exact_caches_get_no_map_and_tq3_keys_decode() {
    // f16 keys are not lossy enough to need one: no map, nothing calibrated.
    let mut exact = runner(DType::F16, true, false);
    assert!(!exact.caches().keys_fitted());
    // Switched to lossy keys (as `--kv-type auto` does), the runner calibrates then; back
    // to exact ones, the map goes.
    let mut types = KvTypes::uniform(DType::F32);
    types.k = DType::Q4_0;
    exact.set_kv_types(types.clone()).expect("q4_0 keys");
    assert!(exact.caches().keys_fitted());
    types.k = DType::BF16;
    exact.set_kv_types(types).expect("bf16 keys");
    assert!(!exact.caches().keys_fitted());
    let mut tq3 = runner(DType::TQ3, true, false);
    assert!(tq3.caches().keys_fitted());
    let (tokens, logits) = greedy_logits(&mut tq3, &PROMPT, 6);
    assert_eq!(tokens.len(), 6);
    assert!(logits.iter().flatten().all(|x| x.is_finite()));
}

/// Mean KL divergence of `rows` from `base` (logit rows of the same positions).
fn mean_kl(base: &[Vec<f32>], rows: &[Vec<f32>]) -> f64 {
    let log_softmax = |r: &[f32]| {
        let m = r.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
        let z = r.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        r.iter().map(move |&x| x as f64 - z).collect::<Vec<f64>>()
    };
    let total: f64 = base
        .iter()
        .zip(rows)
        .map(|(p, q)| {
            let (lp, lq) = (log_softmax(p), log_softmax(q));
            lp.iter()
                .zip(&lq)
                .map(|(a, b)| a.exp() * (a - b))
                .sum::<f64>()
        })
        .sum();
    total / base.len().max(1) as f64
}

/// SmolLM2 (a real model's rotary keys) at a context of 2,048 tokens, its keys fitted from a
/// calibration pass of half that: the layers' statistics are taken before RoPE and averaged
/// over the context's positions (`core/src/kv/rope_moments.rs`), so past the pass's last
/// position the fitted tq3 keys keep the model far closer to the f32 cache than plain tq3
/// keys do. (Statistics taken after RoPE over a pass shorter than the context fit the
/// directions the slow pairs keep there: measured worse than no map at 4,096 tokens.)
#[test]
fn keys_fitted_over_a_short_pass_serve_the_whole_context() {
    use kiln_core::engine::{Logits, CALIBRATION_FIT_TOKENS};
    use kiln_server::load::{load, ModelArgs};
    use kiln_tests::{model_file, SMOLLM2};
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    const CTX: usize = 2048;
    assert!(CALIBRATION_FIT_TOKENS < CTX);
    let loaded = |fit: bool| {
        let mut args = ModelArgs::new(Some(path.display().to_string()), "cpu");
        args.ctx = Some(CTX);
        args.kv_type_k = Some(DType::TQ3);
        args.kv_type_v = Some(DType::F32);
        args.kv_fit_keys = fit;
        let cfg = RunnerConfig {
            max_batch_tokens: 512,
            ..RunnerConfig::default()
        };
        load(&args, cfg).expect("SmolLM2 loads")
    };
    let mut fitted = loaded(true);
    assert!(fitted.runner.caches().keys_fitted());
    let text = std::fs::read_to_string(fixtures().join("text/ppl.txt")).expect("text");
    let tokens = fitted.tokenizer.encode(&text, false).expect("tokens");
    assert!(tokens.len() >= CTX, "{} tokens of text", tokens.len());
    let tokens = &tokens[..CTX];
    // The positions past the calibration pass's.
    let want = Logits::From(CALIBRATION_FIT_TOKENS);
    let run = |r: &mut Runner| {
        let rows = r.feed(1, tokens, want).expect("fed");
        r.release(1).expect("released");
        rows
    };
    let fit_rows = run(&mut fitted.runner);
    let mut plain = loaded(false);
    assert!(!plain.runner.caches().keys_fitted());
    let plain_rows = run(&mut plain.runner);
    plain
        .runner
        .set_kv_types(KvTypes::uniform(DType::F32))
        .expect("f32 cache");
    let base = run(&mut plain.runner);
    assert_eq!(base.len(), CTX - CALIBRATION_FIT_TOKENS);
    let (kl_fit, kl_plain) = (mean_kl(&base, &fit_rows), mean_kl(&base, &plain_rows));
    println!("KL from f32 past the pass: tq3 K plain {kl_plain:.4}, fitted {kl_fit:.4}");
    assert!(kl_plain > 0.0 && kl_fit > 0.0);
    assert!(
        kl_fit < 0.5 * kl_plain,
        "fitted tq3 keys: KL {kl_fit} from f32, plain ones {kl_plain}"
    );
}
