//! kiln in the browser: kiln-core and the WebGPU backend compiled for `wasm32-unknown-unknown`
//! and exposed to JavaScript through wasm-bindgen. Everything here is asynchronous: in a
//! browser, adapters, devices and buffer reads arrive through the event loop, so nothing may
//! block (see `Backend::download_async`).
//!
//! What runs today: the conformance suite on the browser's WebGPU adapter against kiln's CPU
//! reference compiled to wasm ([`conformance_report`]; `web/tests/browser.rs` runs it in
//! headless Chromium through `scripts/web-test.sh`). The natively built crate holds the same
//! code so the workspace's checks cover it.

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::validate::{cases, run_case_async, Status};

/// What a conformance run found on one adapter.
#[derive(Debug, Default)]
pub struct Report {
    /// The adapter, as the backend describes it.
    pub device: String,
    pub passed: usize,
    /// Each failed case: op, case and why.
    pub failures: Vec<String>,
    /// Cases the adapter does not claim (they would run on the CPU reference).
    pub not_supported: usize,
    /// Cases left out in a browser: inputs at unaligned offsets, whose upload needs a
    /// blocking read of the buffer around them.
    pub skipped: usize,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "device": self.device,
            "passed": self.passed,
            "failed": self.failures.len(),
            "failures": self.failures,
            "not_supported": self.not_supported,
            "skipped": self.skipped,
        })
        .to_string()
    }
}

/// Runs every conformance case whose op or label contains `filter` on `candidate` against the
/// CPU reference, reading results back with `download_async`.
pub async fn conformance_on(
    candidate: &dyn Backend,
    filter: Option<&str>,
) -> Result<Report, String> {
    let reference = CpuBackend::with_threads(1);
    let mut report = Report {
        device: candidate.capabilities().device.clone(),
        ..Report::default()
    };
    for case in cases().map_err(|e| e.to_string())? {
        if let Some(f) = filter {
            if !case.op.name().contains(f) && !case.label.contains(f) {
                continue;
            }
        }
        if cfg!(target_arch = "wasm32") && case.offset_inputs {
            report.skipped += 1;
            continue;
        }
        let r = run_case_async(&case, &reference, candidate).await;
        match r.status {
            Status::Pass => report.passed += 1,
            Status::NotSupported => report.not_supported += 1,
            Status::Fail(why) => report.failures.push(format!("{} {}: {why}", r.op, r.case)),
        }
    }
    Ok(report)
}

/// The conformance suite on this browser's WebGPU adapter.
pub async fn conformance_report(filter: Option<&str>) -> Result<Report, String> {
    let gpu = kiln_backend_wgpu::WgpuBackend::open_async()
        .await
        .map_err(|e| e.to_string())?;
    conformance_on(&gpu, filter).await
}

#[cfg(target_arch = "wasm32")]
mod js {
    use wasm_bindgen::prelude::*;

    /// `kiln.conformance(filter?)`: the conformance suite on this browser's WebGPU adapter,
    /// as JSON (`device`, `passed`, `failed`, `failures`, `not_supported`, `skipped`).
    #[wasm_bindgen]
    pub async fn conformance(filter: Option<String>) -> Result<String, JsValue> {
        super::conformance_report(filter.as_deref())
            .await
            .map(|r| r.to_json())
            .map_err(|e| JsValue::from_str(&e))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    /// The asynchronous harness agrees with itself natively: the CPU reference against itself
    /// passes every case it runs.
    #[test]
    fn the_async_harness_passes_the_cpu_against_itself() {
        let cpu = CpuBackend::with_threads(1);
        let fut = conformance_on(&cpu, Some("rms_norm"));
        let report = block_on(fut).expect("cases");
        assert!(report.passed > 0);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
    }

    /// `Runner::step_async` (what the browser steps with) gives the tokens `Runner::step`
    /// gives, natively on the CPU, over the tiny Qwen3.5 fixture.
    #[test]
    fn the_async_step_gives_the_tokens_of_the_blocking_step() {
        use kiln_core::exec::Executor;
        use kiln_core::load::gguf::GgufFile;
        use kiln_core::runner::{Logits, Runner, RunnerConfig};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/hf/gguf/qwen3_5.gguf");
        let run = |blocking: bool| -> Vec<u32> {
            let cpu = std::sync::Arc::new(CpuBackend::with_threads(1));
            let ex = Executor::with_cpu(cpu.clone(), cpu);
            let file = GgufFile::open(&path).expect("the fixture opens");
            let model = kiln_core::model::build_from_gguf(&file, &ex).expect("builds");
            let cfg = RunnerConfig {
                ctx: 64,
                max_seqs: 1,
                ..RunnerConfig::default()
            };
            let mut r = Runner::new(ex, model, cfg).expect("runner");
            let mut step = |toks: &[u32]| -> Vec<f32> {
                let items = [(0u64, toks, Logits::Last)];
                let rows = if blocking {
                    r.step(&items)
                } else {
                    block_on(r.step_async(&items))
                };
                rows.expect("step").remove(0).remove(0)
            };
            let argmax =
                |v: &[f32]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32;
            let mut logits = step(&[11, 48, 85, 122, 159, 196, 233]);
            let mut out = Vec::new();
            for _ in 0..8 {
                let t = argmax(&logits);
                out.push(t);
                logits = step(&[t]);
            }
            out
        };
        assert_eq!(run(false), run(true));
    }

    /// Polls a future that is ready without waiting on anything (the CPU's download is).
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }
}
