#!/usr/bin/env bash
# kiln in the browser against native kiln, same machine, one run: SmolLM2 (or MODEL) in kiln's
# page in headless Chromium (its WebGPU adapter, and the CPU reference compiled to wasm), and
# native kiln on the WebGPU backend (wgpu on whatever Vulkan driver there is: lavapipe here)
# and on the CPU backend. ROUNDS interleaved rounds (default 3); prints each round and the
# medians: prompt and decode tokens/s, and the page's first-load and cached-reload times.
#
#   scripts/web-build.sh && scripts/web-bench.sh [MODEL.gguf]
#
# Needs the page built (target/web), node, playwright-core (target/playwright; `npm install
# playwright-core` there) and Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-$HOME/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${ROUNDS:-3}
[ "$rounds" -ge 1 ] 2>/dev/null || { echo "ROUNDS must be a whole number of at least 1" >&2; exit 1; }
tokens=${MAX_TOKENS:-32}
prompt=${PROMPT:-"Write a long story about a dragon who learns to bake bread."}
web=${KILN_TEST_WEB:-target/web}
pw=${KILN_TEST_PLAYWRIGHT:-$PWD/target/playwright/node_modules/playwright-core}
[ -f "$web/pkg/kiln_web_bg.wasm" ] || { echo "no page in $web: run scripts/web-build.sh" >&2; exit 1; }
[ -f "$model" ] || { echo "no model at $model (kiln pull smollm2-135m-instruct)" >&2; exit 1; }
cargo build --release --quiet -p kiln-server
kiln=target/release/kiln
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$rounds"); do
    for b in webgpu cpu; do
        PLAYWRIGHT=$pw CHROMIUM=/usr/bin/chromium WEB_DIR=$web MODEL=$model PROMPT=$prompt \
            MAX_TOKENS=$tokens BACKEND=$b node tests/web/bench.cjs > "$out/page-$b-$r.json"
        echo "round $r, page ($b): $(cat "$out/page-$b-$r.json")"
    done
    # kiln bench prefills as many tokens as the page's prompt took through the chat template.
    ptoks=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["again"]["promptTokens"])' "$out/page-webgpu-$r.json")
    for b in wgpu cpu; do
        "$kiln" bench -m "$model" --backend "$b" -p "$ptoks" -n "$tokens" -r 1 --json > "$out/native-$b-$r.json"
        echo "round $r, native $b: $(cat "$out/native-$b-$r.json")"
    done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
med = lambda xs: statistics.median(xs)
rows = []
for b in ["webgpu", "cpu"]:
    runs = [json.load(open(f"{out}/page-{b}-{r}.json")) for r in range(1, rounds + 1)]
    f = [x["first"] for x in runs]
    a = [x["again"] for x in runs]
    name = "browser, WebGPU (" + (f[0]["device"] or "?") + ")" if b == "webgpu" else "browser, CPU reference in wasm (1 thread)"
    rows.append((name, med([x["promptTps"] for x in a]), med([x["decodeTps"] for x in a]),
                 f"{med([x['fetchMs'] + x['loadMs'] for x in f]) / 1000:.1f} s",
                 f"{med([x['fetchMs'] + x['loadMs'] for x in a]) / 1000:.1f} s"))
for b in ["wgpu", "cpu"]:
    runs = []
    for r in range(1, rounds + 1):
        lines = [json.loads(l) for l in open(f"{out}/native-{b}-{r}.json") if l.strip().startswith("{")]
        runs.append(lines[-1])
    def pick(j, key):
        if key in j: return j[key]
        for t in j.get("results", []):
            if key in t: return t[key]
        return float("nan")
    name = "native kiln, wgpu (Vulkan driver here)" if b == "wgpu" else "native kiln, CPU backend (all cores)"
    rows.append((name, med([pick(j, "prompt_tps") for j in runs]), med([pick(j, "gen_tps") for j in runs]), "-", "-"))
print(f"\nmedians of {rounds} interleaved rounds:")
print("| where | prompt tokens/s | decode tokens/s | first load | cached reload |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.2f} | {r[3]} | {r[4]} |")
PY
