#!/usr/bin/env bash
# Serving throughput, kiln against llama.cpp on the CPU: N concurrent greedy completions of
# 64 tokens through `kiln serve --max-batch N` and through `llama-server -np N` on the same
# model, alternating servers round by round, and the aggregate generated tokens per second.
#
#   scripts/serve-vs-llamacpp.sh [LLAMACPP_BIN]       # or LLAMACPP_BIN=… in the environment
#
# Environment: CONCURRENT (default 8), TOKENS (default 64), ROUNDS (default 3), THREADS
# (default 2), MODEL (alias or .gguf path; default smollm2-135m-instruct), KILN (binary;
# default target/release/kiln, built if missing), PORT (default 18080).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${LLAMACPP_BIN:-}}
if [ -z "$bin" ] || [ ! -x "$bin/llama-server" ]; then
    echo "usage: $0 LLAMACPP_BIN  (a folder with llama-server; or set LLAMACPP_BIN)" >&2
    exit 2
fi
conc=${CONCURRENT:-8}
tokens=${TOKENS:-64}
rounds=${ROUNDS:-3}
threads=${THREADS:-2}
model=${MODEL:-smollm2-135m-instruct}
kiln=${KILN:-target/release/kiln}
base=${PORT:-18080}
port=$base
[ -x "$kiln" ] || cargo build --release --quiet
path=$("$kiln" pull "$model" 2>/dev/null | tail -1)
[ -f "$path" ] || path=$model
pid=""
stop() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    pid=""
}
trap stop EXIT

start() {
    # Each server on its own port: the other's socket may linger a moment after it stops.
    case $1 in
        kiln) port=$((base + 1)) ;;
        llama) port=$base ;;
    esac
    case $1 in
        kiln) "$kiln" serve -m "$path" -t "$threads" --backend cpu --max-batch "$conc" \
                  --port "$port" >/dev/null 2>&1 & ;;
        llama) "$bin/llama-server" -m "$path" -t "$threads" -np "$conc" -c $((conc * 512)) \
                  --port "$port" >/dev/null 2>&1 & ;;
    esac
    pid=$!
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || { echo "$1 exited at start" >&2; exit 1; }
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "$1 did not come up" >&2
    exit 1
}

# N requests at once, greedy, ignore_eos so every one generates exactly $tokens tokens.
load() {
    python3 - "$port" "$conc" "$tokens" <<'PY'
import json, sys, time, threading, urllib.request
port, n, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
prompts = [f"Write a long story about a traveller number {i} who crosses the mountains." for i in range(n)]
got = [0] * n
def one(i):
    body = json.dumps({"prompt": prompts[i], "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        got[i] = json.load(r)["usage"]["completion_tokens"]
one(0)  # warm-up
t0 = time.time()
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
dt = time.time() - t0
print(f"{sum(got) / dt:.1f} {sum(got)}")
PY
}

declare -A res
for r in $(seq "$rounds"); do
    for s in llama kiln; do
        start "$s"
        out=$(load)
        stop
        echo "== round $r/$rounds: $s: $out (aggregate t/s, tokens)" >&2
        res[$s]="${res[$s]:-} ${out%% *}"
    done
done
python3 - "$conc" "$tokens" "$threads" "$path" "${res[llama]}" "${res[kiln]}" <<'PY'
import statistics, sys, os, datetime
conc, tokens, threads, path, ll, kk = sys.argv[1:7]
ll = [float(x) for x in ll.split()]; kk = [float(x) for x in kk.split()]
a, b = statistics.median(ll), statistics.median(kk)
print(f"{datetime.date.today()}, {os.cpu_count()} cores, {threads} threads; medians of {len(ll)} alternating rounds\n")
print("| model | concurrent | tokens each | llama-server t/s | kiln serve t/s | kiln / llama.cpp |")
print("|---|---|---|---|---|---|")
print(f"| {os.path.basename(path)} | {conc} | {tokens} | {a:.1f} | {b:.1f} | {b / a:.2f}× |")
PY
