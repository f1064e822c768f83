#!/usr/bin/env bash
# Builds kiln's browser page: kiln-web for wasm32 (kiln-core and the WebGPU backend), its
# JavaScript glue (wasm-bindgen), and the page (web/index.html, app.js, worker.js, app.css)
# into a static folder any web server can serve: OUT (default target/web).
#
#   scripts/web-build.sh [OUT]
#   python3 -m http.server -d target/web 8000   # then open http://localhost:8000
#
# Installs what it needs (Debian's rustc-web and lld, wasm-bindgen-cli); the first build takes
# several minutes, later ones seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/web}
KILN_WEB_BROWSER=0
source scripts/lib/web-tools.sh

echo "== kiln-web for wasm32"
(cd web && web_cargo build --release --lib --locked)
wasm=target/wasm/wasm32-unknown-unknown/release/kiln_web.wasm

echo "== page into $out"
mkdir -p "$out"
rm -rf "$out/pkg"
"$bindgen/wasm-bindgen" --target web --no-typescript --out-dir "$out/pkg" "$wasm"
cp web/index.html web/app.js web/worker.js web/app.css "$out/"
cp server/webui/icon.svg "$out/"
mkdir -p "$out/models"
ls -l "$out" "$out/pkg" | sed 's/^/  /'
echo "built $out: serve it (e.g. python3 -m http.server -d $out 8000) and open it in a browser with WebGPU"
