#!/usr/bin/env bash
# kiln in the browser, tested: builds kiln-web for wasm32-unknown-unknown and runs its
# wasm-bindgen tests in headless Chromium (the conformance cases the browser's WebGPU adapter
# claims, against kiln's CPU reference compiled to wasm). Installs what it needs: Debian's
# rustc-web (it builds std for wasm32), lld, Chromium and chromedriver, and wasm-bindgen-cli
# 0.2.130 (into target/wasm-bindgen). Extra arguments go to `cargo test` (e.g. a test name).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/web-tools.sh

echo "== kiln-web tests in headless Chromium"
runner="$PWD/$bindgen/wasm-bindgen-test-runner"
cd web
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$runner" \
CHROMEDRIVER=/usr/bin/chromedriver \
WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-600} \
    web_cargo test --release --locked --tests "$@"
