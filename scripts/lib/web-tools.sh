# Sourced by scripts/web-build.sh and scripts/web-test.sh: installs what building kiln for
# wasm32 needs, once. Debian's rustc-web (its std source builds for wasm32-unknown-unknown),
# lld, Chromium and chromedriver, and wasm-bindgen-cli 0.2.130 (matching the wasm-bindgen
# crate's pin) into target/wasm-bindgen. Sets $bindgen to that folder.
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
need=()
[ -x /usr/bin/rustc ] && /usr/bin/rustc --version | grep -q "1\.96" || need+=(rustc-web cargo-web libstd-rust-web-dev rust-web-src)
command -v lld-22 >/dev/null 2>&1 || need+=(lld-22)
if [ "${KILN_WEB_BROWSER:-1}" = 1 ]; then
    [ -x /usr/bin/chromium ] || need+=(chromium)
    [ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
fi
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing ${need[*]}"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

bindgen=target/wasm-bindgen
if [ ! -x "$bindgen/wasm-bindgen" ] || [ ! -x "$bindgen/wasm-bindgen-test-runner" ]; then
    mkdir -p "$bindgen"
    if [ -f ../shared/tools/wasm-bindgen-cli-0.2.130.tgz ]; then
        tar xzf ../shared/tools/wasm-bindgen-cli-0.2.130.tgz -C "$bindgen"
    else
        echo "== building wasm-bindgen-cli 0.2.130 (once; several minutes)"
        cargo install wasm-bindgen-cli --version 0.2.130 --root "$bindgen/root"
        cp "$bindgen"/root/bin/* "$bindgen"/
    fi
fi

# Debian's cargo and rustc 1.96 build std for wasm32 (rustup's toolchains cannot here).
# (wasm's simd128 target feature was tried: the CPU reference's decode went 7.05 -> 7.67
# tokens/s on SmolLM2, within noise, so the build keeps to baseline wasm.)
wasm_target="$PWD/target/wasm"
web_cargo() {
    RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$wasm_target" \
        /usr/bin/cargo "$1" -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown "${@:2}"
}
