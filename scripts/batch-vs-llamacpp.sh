#!/usr/bin/env bash
# Decoding several sequences together over a long context, kiln against llama.cpp on the CPU:
# N sequences, each after a prompt of DEPTH tokens, generating GEN tokens together; the
# aggregate decode tokens per second of both (llama.cpp: `llama-batched-bench -npp DEPTH -ntg
# GEN -npl N`, its S_TG; kiln: `kiln bench -c N -d DEPTH -n GEN`, the tokens a second while
# every request decodes), interleaved round by round, medians and the ratio kiln / llama.cpp.
#
#   scripts/batch-vs-llamacpp.sh [LLAMACPP_BIN]       # or LLAMACPP_BIN=… in the environment
#   CONCURRENT="4 8" DEPTH=2000 MODELS="smollm2-135m-instruct gemma3-270m" scripts/batch-vs-llamacpp.sh BIN
#
# LLAMACPP_BIN is the folder ../shared/tools/llamacpp.sh prints. It builds no
# llama-batched-bench; when the folder lacks one, this script compiles it (a few seconds) from
# the llama.cpp source beside that folder (../src/vendor/llama.cpp), against its libraries.
# Environment: CONCURRENT (sequences, default 4), DEPTH (default 2000), GEN (default 96),
# THREADS (default 2), ROUNDS (default 3), MODELS (kiln aliases or .gguf paths; default
# smollm2-135m-instruct), KILN (binary; default target/release/kiln, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${LLAMACPP_BIN:-}}
if [ -z "$bin" ] || [ ! -d "$bin" ]; then
    echo "usage: $0 LLAMACPP_BIN  (the folder ../shared/tools/llamacpp.sh prints; or set LLAMACPP_BIN)" >&2
    exit 2
fi
conc=${CONCURRENT:-4}
depth=${DEPTH:-2000}
gen=${GEN:-96}
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
models=${MODELS:-smollm2-135m-instruct}
kiln=${KILN:-target/release/kiln}
[ -x "$kiln" ] || cargo build --release --quiet

if [ ! -x "$bin/llama-batched-bench" ]; then
    src="$bin/../../src/vendor/llama.cpp"
    if [ ! -f "$src/tools/batched-bench/batched-bench.cpp" ]; then
        echo "no llama-batched-bench in $bin and no llama.cpp source at $src" >&2
        exit 2
    fi
    echo "compiling $bin/llama-batched-bench" >&2
    g++ -O2 -std=c++17 -I "$src/include" -I "$src/common" -I "$src/ggml/include" -I "$src/vendor" \
        "$src/tools/batched-bench/batched-bench.cpp" "$src/tools/batched-bench/main.cpp" \
        -o "$bin/llama-batched-bench" -L "$bin" -lllama-common -lllama -lggml -lggml-base \
        -Wl,-rpath,'$ORIGIN'
fi

rows=""
for m in $models; do
    path=$("$kiln" pull "$m" 2>/dev/null | tail -1) || true
    [ -f "$path" ] || path=$m
    [ -f "$path" ] || { echo "no model $m" >&2; exit 2; }
    for c in $conc; do
        ll="" kk=""
        for r in $(seq "$rounds"); do
            echo "== $(basename "$path"), $c sequences at $depth tokens, round $r/$rounds" >&2
            a=$("$bin/llama-batched-bench" -m "$path" -t "$threads" -c $((c * (depth + gen) + 64)) \
                -b 2048 -ub 512 -npp "$depth" -ntg "$gen" -npl "$c" --output-format jsonl 2>/dev/null |
                python3 -c 'import json,sys
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"): print(json.loads(l)["speed_tg"])')
            b=$("$kiln" bench -m "$path" --backend cpu -t "$threads" -c "$c" -d "$depth" -n "$gen" -r 1 \
                2>/dev/null | tail -1 | awk -F'|' '{print $6}' | awk '{print $1}')
            echo "   llama.cpp $a, kiln $b" >&2
            ll="$ll $a" kk="$kk $b"
        done
        rows="$rows$(basename "$path") $c$ll /$kk;"
    done
done
python3 - "$depth" "$gen" "$threads" "$rounds" "$rows" <<'PY'
import statistics, sys
sys.path.insert(0, "scripts/lib")
from bench_header import header
depth, gen, threads, rounds, rows = sys.argv[1:6]
print(header(rounds, threads))
print("| model | sequences | test | llama.cpp t/s | kiln t/s | kiln / llama.cpp |")
print("|---|---|---|---|---|---|")
for row in filter(None, rows.split(";")):
    left, right = row.split("/")
    name, c, *ll = left.split()
    kk = right.split()
    a = statistics.median(float(x) for x in ll) if ll else float("nan")
    b = statistics.median(float(x) for x in kk) if kk else float("nan")
    print(f"| {name} | {c} | tg{gen} @ d{depth} | {a:.1f} | {b:.1f} | {b / a:.2f}× |")
PY
