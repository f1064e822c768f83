//! In a browser: greedy tokens of the tiny Qwen3.5 (Gated DeltaNet hybrid) and Gemma 4
//! fixtures (`tests/fixtures/hf/gguf/`), loaded from bytes, stepped on the browser's WebGPU
//! adapter with every op on it (strict) and the logits read with `download_async`, equal the
//! tokens of kiln's CPU reference compiled to wasm on the same page.
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use kiln_core::cpu::CpuBackend;
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
use kiln_core::runner::{Logits, Runner, RunnerConfig};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const QWEN3_5: &[u8] = include_bytes!("../../tests/fixtures/hf/gguf/qwen3_5.gguf");
const GEMMA4: &[u8] = include_bytes!("../../tests/fixtures/hf/gguf/gemma4.gguf");

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// 12 greedy tokens after a 7-token prompt.
async fn greedy(ex: Executor, bytes: &[u8]) -> Vec<u32> {
    let file = GgufFile::from_bytes("fixture", bytes.to_vec()).expect("the fixture parses");
    let model = build_from_gguf(&file, &ex).expect("the model builds");
    let cfg = RunnerConfig {
        ctx: 64,
        max_seqs: 1,
        ..RunnerConfig::default()
    };
    let mut r = Runner::new(ex, model, cfg).expect("runner");
    let vocab = r.model().info().vocab as u32;
    let prompt: Vec<u32> = (0..7u32).map(|i| (i * 37 + 11) % vocab).collect();
    let mut rows = r
        .step_async(&[(0, &prompt, Logits::Last)])
        .await
        .expect("prefill");
    let mut out = Vec::new();
    for _ in 0..12 {
        let t = argmax(&rows[0][0]);
        out.push(t);
        rows = r
            .step_async(&[(0, &[t], Logits::Last)])
            .await
            .expect("decode step");
    }
    out
}

async fn check(name: &str, bytes: &[u8]) {
    let cpu = Arc::new(CpuBackend::with_threads(1));
    let want = greedy(Executor::with_cpu(cpu.clone(), cpu.clone()), bytes).await;
    let gpu = kiln_backend_wgpu::WgpuBackend::open_async()
        .await
        .expect("a WebGPU adapter in the browser");
    let got = greedy(Executor::with_cpu(Arc::new(gpu), cpu).strict(true), bytes).await;
    console_log!("{name}: cpu {want:?}, webgpu {got:?}");
    assert_eq!(
        got, want,
        "{name}: WebGPU in the browser vs the CPU reference"
    );
}

#[wasm_bindgen_test]
async fn qwen3_5_greedy_tokens_in_the_browser_equal_the_cpu_reference() {
    check("qwen3_5", QWEN3_5).await;
}

#[wasm_bindgen_test]
async fn gemma4_greedy_tokens_in_the_browser_equal_the_cpu_reference() {
    check("gemma4", GEMMA4).await;
}
