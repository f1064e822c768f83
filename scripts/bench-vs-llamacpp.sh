#!/usr/bin/env bash
# kiln against llama.cpp on the CPU, side by side: for each model, prompt processing and
# generation of both, interleaved (llama.cpp, kiln, llama.cpp, kiln, …) so that a noisy machine
# hits both alike, and one markdown table with the medians and the ratio kiln / llama.cpp.
#
#   scripts/bench-vs-llamacpp.sh [LLAMACPP_BIN]       # or LLAMACPP_BIN=… in the environment
#   MODELS="llama1b-q4_k llama3b-q6_k" PROMPT=512 scripts/bench-vs-llamacpp.sh BIN
#
# LLAMACPP_BIN is the folder holding llama-bench (../shared/tools/llamacpp.sh prints one).
# Environment: THREADS (default "2 1"), ROUNDS (interleaved rounds, default 3), PROMPT and GEN
# (tokens of the pp and tg tests, default 128 and 64), DEPTH (tokens of context both tests
# start after, llama-bench's -d; default 0), MODELS (default "smollm2-135m-instruct
# gemma3-270m"; each a kiln alias, a .gguf path, or a random-weight Llama checkpoint made on the
# spot: llama1b-TYPE or llama3b-TYPE with TYPE q4_k, q5_k, q6_k, q8_0 or iq4_xs, written once to
# $KILN_BENCH_MODELS, default ~/.cache/kiln/bench, by scripts/gpu/random-gguf.py with SmolLM2's
# vocabulary; needs `pip install gguf`), KILN (the kiln binary; default target/release/kiln,
# built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${LLAMACPP_BIN:-}}
if [ -z "$bin" ] || [ ! -x "$bin/llama-bench" ]; then
    echo "usage: $0 LLAMACPP_BIN  (a folder with llama-bench; or set LLAMACPP_BIN)" >&2
    exit 2
fi
threads=${THREADS:-"2 1"}
rounds=${ROUNDS:-3}
prompt=${PROMPT:-128}
gen=${GEN:-64}
depth=${DEPTH:-0}
models=${MODELS:-"smollm2-135m-instruct gemma3-270m"}
made=${KILN_BENCH_MODELS:-$HOME/.cache/kiln/bench}
kiln=${KILN:-target/release/kiln}
if [ ! -x "$kiln" ]; then
    cargo build --release --quiet
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A random-weight Llama checkpoint of a named shape, made once.
random_model() {
    local shape=${1%%-*} type=${1#*-} args
    case $shape in
        llama1b) args="--hidden 2048 --layers 16 --ffn 8192 --heads 32 --kv-heads 8" ;;
        llama3b) args="--hidden 3072 --layers 28 --ffn 8192 --heads 24 --kv-heads 8" ;;
        *) echo "unknown model $1" >&2; return 1 ;;
    esac
    case $type in q4_k|q5_k|q6_k|q8_0|iq4_xs) ;; *) echo "unknown type in $1 (q4_k, q5_k, q6_k, q8_0, iq4_xs)" >&2; return 1 ;; esac
    local out="$made/$1.gguf"
    if [ ! -f "$out" ]; then
        mkdir -p "$made"
        local vocab
        vocab=$("$kiln" pull smollm2-135m-instruct 2>/dev/null | tail -1)
        [ -f "$made/vocab.gguf" ] || python3 scripts/gpu/random-gguf.py template "$vocab" "$made/vocab.gguf" >&2
        echo "making $out" >&2
        # shellcheck disable=SC2086
        python3 scripts/gpu/random-gguf.py make --template "$made/vocab.gguf" --out "$out.part" \
            $args --type "$type" >&2
        mv "$out.part" "$out"
    fi
    echo "$out"
}

names=""
for m in $models; do
    case $m in
        llama1b-*|llama3b-*) path=$(random_model "$m") ;;
        *) path=$("$kiln" pull "$m" 2>/dev/null | tail -1) || true ;;
    esac
    [ -f "$path" ] || path=$m
    if [ ! -f "$path" ]; then
        echo "no model $m" >&2
        exit 2
    fi
    m=$(basename "$m" .gguf)
    names="$names $m"
    for t in $threads; do
        for r in $(seq "$rounds"); do
            echo "== $m, $t threads, round $r/$rounds" >&2
            "$bin/llama-bench" -m "$path" -p "$prompt" -n "$gen" -d "$depth" -t "$t" -r 1 -o json \
                >"$tmp/llama-$m-$t-$r.json" 2>/dev/null
            "$kiln" bench -m "$path" -p "$prompt" -n "$gen" -d "$depth" -t "$t" -r 1 \
                --ctx $((depth + prompt + gen + 16)) --backend cpu --json \
                2>/dev/null | tail -1 >"$tmp/kiln-$m-$t-$r.json"
        done
    done
done

python3 - "$tmp" "$rounds" "$threads" "$prompt" "$gen" "$depth" $names <<'PY'
import json, statistics, sys
sys.path.insert(0, "scripts/lib")
from bench_header import header
tmp, rounds, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
prompt, gen, depth, models = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
at = f" @ d{depth}" if depth > 0 else ""
pp, tg = f"pp{prompt}{at}", f"tg{gen}{at}"
def med(v): return statistics.median(v) if v else float("nan")
print(header(rounds))
print("| model | threads | test | llama.cpp t/s | kiln t/s | kiln / llama.cpp |")
print("|---|---|---|---|---|---|")
for m in models:
    for t in threads:
        ll = {pp: [], tg: []}
        kk = {pp: [], tg: []}
        for r in range(1, rounds + 1):
            try:
                for row in json.load(open(f"{tmp}/llama-{m}-{t}-{r}.json")):
                    key = pp if row["n_prompt"] > 0 else tg
                    ll[key].append(row["avg_ts"])
            except (OSError, ValueError, KeyError):
                pass
            try:
                k = json.load(open(f"{tmp}/kiln-{m}-{t}-{r}.json"))
                kk[pp].append(k["prompt_tps"]); kk[tg].append(k["gen_tps"])
            except (OSError, ValueError, KeyError):
                pass
        for test in (pp, tg):
            a, b = med(ll[test]), med(kk[test])
            if not (a > 0 and b > 0):
                continue
            print(f"| {m} | {t} | {test} | {a:.1f} | {b:.1f} | {b / a:.2f}× |")
PY
