#!/usr/bin/env bash
# kiln against llama.cpp on the CPU, side by side: for each model, pp128 and tg64 of both,
# interleaved (llama.cpp, kiln, llama.cpp, kiln, …) so that a noisy machine hits both alike,
# and one markdown table with the medians and the ratio kiln / llama.cpp.
#
#   scripts/bench-vs-llamacpp.sh [LLAMACPP_BIN]       # or LLAMACPP_BIN=… in the environment
#
# LLAMACPP_BIN is the folder holding llama-bench (../shared/tools/llamacpp.sh prints one).
# Environment: THREADS (default "2 1"), ROUNDS (interleaved rounds, default 3), MODELS
# (default "smollm2-135m-instruct gemma3-270m"; aliases or .gguf paths), KILN (the kiln
# binary; default target/release/kiln, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${LLAMACPP_BIN:-}}
if [ -z "$bin" ] || [ ! -x "$bin/llama-bench" ]; then
    echo "usage: $0 LLAMACPP_BIN  (a folder with llama-bench; or set LLAMACPP_BIN)" >&2
    exit 2
fi
threads=${THREADS:-"2 1"}
rounds=${ROUNDS:-3}
models=${MODELS:-"smollm2-135m-instruct gemma3-270m"}
kiln=${KILN:-target/release/kiln}
if [ ! -x "$kiln" ]; then
    cargo build --release --quiet
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for m in $models; do
    path=$("$kiln" pull "$m" 2>/dev/null | tail -1)
    [ -f "$path" ] || path=$m
    for t in $threads; do
        for r in $(seq "$rounds"); do
            echo "== $m, $t threads, round $r/$rounds" >&2
            "$bin/llama-bench" -m "$path" -p 128 -n 64 -t "$t" -r 1 -o json \
                >"$tmp/llama-$m-$t-$r.json" 2>/dev/null
            "$kiln" bench -m "$path" -p 128 -n 64 -t "$t" -r 1 --backend cpu --json \
                2>/dev/null | tail -1 >"$tmp/kiln-$m-$t-$r.json"
        done
    done
done

python3 - "$tmp" "$rounds" "$threads" $models <<'PY'
import json, statistics, sys, os, platform, datetime, subprocess
tmp, rounds, threads, models = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def med(v): return statistics.median(v) if v else float("nan")
cpu = "?"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip(); break
except OSError:
    pass
print(f"{datetime.date.today()}, {cpu}, {os.cpu_count()} cores; medians of {rounds} interleaved rounds\n")
print("| model | threads | test | llama.cpp t/s | kiln t/s | kiln / llama.cpp |")
print("|---|---|---|---|---|---|")
for m in models:
    for t in threads:
        ll = {"pp128": [], "tg64": []}
        kk = {"pp128": [], "tg64": []}
        for r in range(1, rounds + 1):
            try:
                for row in json.load(open(f"{tmp}/llama-{m}-{t}-{r}.json")):
                    key = "pp128" if row["n_prompt"] == 128 else "tg64"
                    ll[key].append(row["avg_ts"])
            except (OSError, ValueError, KeyError):
                pass
            try:
                k = json.load(open(f"{tmp}/kiln-{m}-{t}-{r}.json"))
                kk["pp128"].append(k["prompt_tps"]); kk["tg64"].append(k["gen_tps"])
            except (OSError, ValueError, KeyError):
                pass
        for test in ("pp128", "tg64"):
            a, b = med(ll[test]), med(kk[test])
            print(f"| {m} | {t} | {test} | {a:.1f} | {b:.1f} | {b / a:.2f}× |")
PY
