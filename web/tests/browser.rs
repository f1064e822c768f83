//! In a browser (headless Chromium through wasm-bindgen-test-runner; see
//! `scripts/web-test.sh`): the conformance cases the browser's WebGPU adapter claims agree with
//! kiln's CPU reference compiled to wasm, and the adapter claims some.
#![cfg(target_arch = "wasm32")]

use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test]
async fn the_browser_adapter_passes_the_conformance_cases_it_claims() {
    let r = kiln_web::conformance_report(None)
        .await
        .expect("a WebGPU adapter in the browser");
    web_sys_log(&r.to_json());
    assert!(r.passed > 0, "the adapter claims no op: {}", r.to_json());
    assert!(r.failures.is_empty(), "{}", r.failures.join("\n"));
}

fn web_sys_log(s: &str) {
    wasm_bindgen_test::console_log!("{s}");
}
