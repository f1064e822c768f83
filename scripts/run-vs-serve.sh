#!/usr/bin/env bash
# `kiln run` against a one-request `kiln serve`, side by side: the same greedy text, and the
# prompt and generation speed each reports (llama.cpp's `timings`), over a few alternating
# rounds. Usage: scripts/run-vs-serve.sh [MODEL] [N_TOKENS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2-135m-instruct}
N=${2:-64}
ROUNDS=${3:-3}
PORT=${PORT:-18181}
KILN=./target/release/kiln
PROMPT="Once upon a time, in a small village by the sea, there lived"
[ -x "$KILN" ] || cargo build --release
"$KILN" serve -m "$MODEL" --port "$PORT" --max-batch 1 2>/dev/null &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 0.2
done
printf '| round | command | same text | prompt t/s | generation t/s |\n|---|---|---|---|---|\n'
for r in $(seq "$ROUNDS"); do
    # The server's prefix cache would serve a repeated prompt (`kiln run` starts with an empty
    # cache), so each round's prompt is its own from the start.
    p="Story $r. $PROMPT"
    body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": int(sys.argv[2]), "temperature": 0}))' "$p" "$N")
    run=$("$KILN" run -m "$MODEL" --temp 0 -n "$N" --json "$p" 2>/dev/null)
    srv=$(curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d "$body")
    python3 - "$run" "$srv" "$r" <<'PY'
import json, sys
run, srv, r = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
same = run["text"] == srv["choices"][0]["text"]
for name, t in (("kiln run", run["timings"]), ("kiln serve", srv["timings"])):
    print(f"| {r} | {name} | {'yes' if same else 'NO'} | {t['prompt_per_second']:.1f} | {t['predicted_per_second']:.1f} |")
PY
done
