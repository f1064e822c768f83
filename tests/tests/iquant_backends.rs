//! A model in every i-quant and ternary format on every backend: the random-weight Llama of
//! `fixtures/hf/gguf/llama_iquants.gguf` (its matrices in IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S, IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, TQ1_0 and TQ2_0 in turn, so each format is some
//! projection) decodes greedily on WebGPU and on the emulated CUDA kernels with every op on the
//! GPU (strict executors), the CPU reference's tokens and its logits to f32 rounding.
//! `exact.rs` holds the CPU to an f64 forward over the same file.

use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::engine::{Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::DType;
use kiln_tests::{fixtures, greedy_logits, local_iq_models, optional_backend};

fn runner(ex: Executor) -> Runner {
    let path = fixtures().join("hf/gguf/llama_iquants.gguf");
    let file = open_model(&path).expect("checkpoint opens");
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        max_batch_tokens: 16,
        block_size: 4,
        max_seqs: 2,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

fn check(name: &str, gpu: Arc<dyn Backend>) {
    let path = fixtures().join("hf/gguf/llama_iquants.gguf");
    let file = open_model(&path).expect("checkpoint opens");
    let types: std::collections::BTreeSet<DType> = file.tensors().iter().map(|t| t.dtype).collect();
    for d in DType::IQUANTS {
        assert!(types.contains(&d), "the fixture has no {d} tensor");
    }
    let prompt = [259u32, 283, 81, 223, 89, 81, 84, 78, 70, 12, 300];
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1));
    let (want_t, want) = greedy_logits(&mut runner(Executor::new(cpu)), &prompt, 6);
    let mut run = runner(Executor::new(gpu).strict(true));
    let (got_t, got) = greedy_logits(&mut run, &prompt, 6);
    assert!(
        run.executor().fallbacks().is_empty(),
        "{name} ran ops on the CPU: {:?}",
        run.executor().fallbacks()
    );
    let scale = want
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(1e-6);
    let worst = got
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    println!("{name} vs CPU: tokens {got_t:?} / {want_t:?}, max |Δ| {worst:.3e} of logits up to {scale:.3}");
    assert_eq!(got_t, want_t, "{name}'s greedy tokens");
    // The weights decode to the CPU's floats bit for bit; what differs is the summation order.
    assert!(
        worst <= 1e-4 * scale,
        "max |Δ| {worst} (logits up to {scale})"
    );
}

#[test]
fn every_i_quant_decodes_on_wgpu_as_on_the_cpu() {
    if let Some(b) = optional_backend("wgpu", kiln_backend_wgpu::open) {
        check("wgpu", b);
    }
}

#[test]
fn every_i_quant_decodes_on_emulated_cuda_as_on_the_cpu() {
    if let Some(b) = kiln_tests::cuda_emu() {
        check("emulated CUDA", b);
    }
}

/// Real files requantized by llama-quantize (SmolLM2 and Gemma 3 into IQ4_XS, IQ3_S, IQ2_XXS
/// and TQ2_0; see README "I-quants and ternary weights"): every `.gguf` in
/// `KILN_TEST_IQ_MODELS` decodes greedily on WebGPU and emulated CUDA with the CPU's tokens,
/// every op on the GPU. Not in CI (llama-quantize and the files are local); skips when unset.
/// `KILN_TEST_IQ_STEPS` sets the tokens (default 8; the emulator takes minutes a token at the
/// 270 M model's size).
#[test]
fn local_quantized_files_decode_alike_on_every_backend() {
    let Some(files) = local_iq_models() else {
        println!("skipping: KILN_TEST_IQ_MODELS is not set");
        return;
    };
    let steps = std::env::var("KILN_TEST_IQ_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let mut backends: Vec<(&str, Arc<dyn Backend>)> = Vec::new();
    if let Some(b) = optional_backend("wgpu", kiln_backend_wgpu::open) {
        backends.push(("wgpu", b));
    }
    if let Some(b) = kiln_tests::cuda_emu() {
        backends.push(("emulated CUDA", b));
    }
    for path in files {
        let file = open_model(&path).expect("model parses");
        let tok = kiln_core::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
        let prompt = tok
            .encode("The capital of France is", true)
            .expect("encode");
        let run = |ex: Executor| {
            let model = build_from_gguf(&file, &ex).expect("model builds");
            let cfg = RunnerConfig {
                ctx: 256,
                max_batch_tokens: 64,
                ..RunnerConfig::default()
            };
            Runner::new(ex, model, cfg).expect("runner")
        };
        let (want, _) = greedy_logits(&mut run(Executor::cpu()), &prompt, steps);
        for (name, b) in &backends {
            let mut r = run(Executor::new(b.clone()).strict(true));
            let (got, _) = greedy_logits(&mut r, &prompt, steps);
            assert!(r.executor().fallbacks().is_empty(), "{name}: CPU fallbacks");
            println!(
                "{}: {name} {:?} / cpu {:?}",
                path.display(),
                tok.decode(&got),
                tok.decode(&want)
            );
            assert_eq!(got, want, "{}: {name}'s greedy tokens", path.display());
        }
    }
}
