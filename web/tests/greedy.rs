//! In a browser: greedy tokens of the tiny Llama, Qwen3.5 (Gated DeltaNet hybrid) and Gemma 4
//! fixtures (`tests/fixtures/hf/gguf/`), loaded from bytes, stepped on the browser's WebGPU
//! adapter with every op on it (strict) and the logits read with `download_async`, equal native
//! kiln's (`greedy.json`, checked natively against kiln and transformers by kiln-web's test
//! `the_browser_fixtures_greedy_tokens_are_native_kilns_and_transformers`), as do those of
//! kiln's CPU reference compiled to wasm on the same page.
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use kiln_core::cpu::CpuBackend;
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_web::{greedy_expected, greedy_tokens};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const EXPECTED: &str = include_str!("../../tests/fixtures/hf/gguf/greedy.json");
const LLAMA: &[u8] = include_bytes!("../../tests/fixtures/hf/gguf/llama.gguf");
const QWEN3_5: &[u8] = include_bytes!("../../tests/fixtures/hf/gguf/qwen3_5.gguf");
const GEMMA4: &[u8] = include_bytes!("../../tests/fixtures/hf/gguf/gemma4.gguf");

async fn check(name: &str, bytes: &[u8]) {
    let all = greedy_expected(EXPECTED).expect("greedy.json parses");
    let (_, prompt, want) = all
        .iter()
        .find(|(n, _, _)| n == name)
        .expect("the fixture is in greedy.json");
    let file = GgufFile::from_bytes(name, bytes.to_vec()).expect("the fixture parses");
    let cpu = Arc::new(CpuBackend::with_threads(1));
    let on_cpu = greedy_tokens(
        Executor::with_cpu(cpu.clone(), cpu.clone()),
        &file,
        prompt,
        want.len(),
    )
    .await
    .expect("wasm CPU");
    let gpu = kiln_backend_wgpu::WgpuBackend::open_async()
        .await
        .expect("a WebGPU adapter in the browser");
    let ex = Executor::with_cpu(Arc::new(gpu), cpu).strict(true);
    let on_gpu = greedy_tokens(ex, &file, prompt, want.len())
        .await
        .expect("WebGPU");
    console_log!("{name}: native {want:?}, wasm cpu {on_cpu:?}, webgpu {on_gpu:?}");
    assert_eq!(
        &on_gpu, want,
        "{name}: WebGPU in the browser vs native kiln"
    );
    assert_eq!(
        &on_cpu, want,
        "{name}: the CPU reference in wasm vs native kiln"
    );
}

#[wasm_bindgen_test]
async fn llama_greedy_tokens_in_the_browser_equal_native_kilns() {
    check("llama", LLAMA).await;
}

#[wasm_bindgen_test]
async fn qwen3_5_greedy_tokens_in_the_browser_equal_native_kilns() {
    check("qwen3_5", QWEN3_5).await;
}

#[wasm_bindgen_test]
async fn gemma4_greedy_tokens_in_the_browser_equal_native_kilns() {
    check("gemma4", GEMMA4).await;
}
