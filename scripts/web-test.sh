#!/usr/bin/env bash
# kiln in the browser, tested: builds kiln-web for wasm32-unknown-unknown and runs its
# wasm-bindgen tests in headless Chromium (the conformance cases the browser's WebGPU adapter
# claims, against kiln's CPU reference compiled to wasm). Installs what it needs: Debian's
# rustc-web (it builds std for wasm32), lld, Chromium and chromedriver, and wasm-bindgen-cli
# 0.2.130 (into target/wasm-bindgen). Extra arguments go to `cargo test` (e.g. a test name).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
need=()
[ -x /usr/bin/rustc ] && /usr/bin/rustc --version | grep -q "1\.96" || need+=(rustc-web cargo-web libstd-rust-web-dev rust-web-src)
command -v lld-22 >/dev/null 2>&1 || need+=(lld-22)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing ${need[*]}"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# wasm-bindgen-cli, matching the wasm-bindgen crate (=0.2.130).
bindgen=target/wasm-bindgen
if [ ! -x "$bindgen/wasm-bindgen-test-runner" ]; then
    mkdir -p "$bindgen"
    if [ -f ../shared/tools/wasm-bindgen-cli-0.2.130.tgz ]; then
        tar xzf ../shared/tools/wasm-bindgen-cli-0.2.130.tgz -C "$bindgen"
    else
        echo "== building wasm-bindgen-cli 0.2.130 (once; several minutes)"
        cargo install wasm-bindgen-cli --version 0.2.130 --root "$bindgen/root"
        cp "$bindgen"/root/bin/* "$bindgen"/
    fi
fi

echo "== kiln-web tests in headless Chromium"
cd web
RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
CARGO_TARGET_DIR=../target/wasm \
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$PWD/../$bindgen/wasm-bindgen-test-runner" \
CHROMEDRIVER=/usr/bin/chromedriver \
WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-600} \
    /usr/bin/cargo test --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown "$@"
