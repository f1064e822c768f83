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
