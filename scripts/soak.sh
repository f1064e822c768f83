#!/usr/bin/env bash
# A soak of `kiln serve`: STREAMS clients streaming at once for MINUTES, completions and chat,
# prompts of many lengths (some sharing a prefix, so the prefix cache is hit), and one request
# in ten dropped mid-stream on purpose. Every 10 s it prints the server's resident memory and
# the requests done; at the end it checks that nothing failed, that the KV pool is free again
# and that memory stayed flat (the last third of the run no higher than the middle third,
# with 5% slack). The KV pool is KV_BLOCKS blocks (default 1024): the prefix cache keeps
# freed blocks, so the whole pool's memory is touched within the first minutes and the RSS
# that follows is the server's own. A bench script, not a CI test.
# Usage: scripts/soak.sh [MODEL] [MINUTES] [STREAMS]   (defaults: smollm2-135m-instruct 10 64)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2-135m-instruct}
MINUTES=${2:-10}
STREAMS=${3:-64}
PORT=${PORT:-18182}
KILN=./target/release/kiln
[ -x "$KILN" ] || cargo build --release
"$KILN" serve -m "$MODEL" --port "$PORT" --max-batch 16 --max-queue "$STREAMS" --kv-blocks "${KV_BLOCKS:-1024}" 2>/tmp/kiln-soak.log &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { cat /tmp/kiln-soak.log; exit 1; }
    sleep 0.2
done
python3 - "$PORT" "$SERVER" "$MINUTES" "$STREAMS" <<'PY'
import http.client, json, random, sys, threading, time

port, pid, minutes, streams = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
end_at = time.time() + minutes * 60
lock = threading.Lock()
count = {"ok": 0, "dropped": 0, "error": 0, "tokens": 0}
errors = []

WORDS = ("river stone lantern orbit maple copper signal harbor meadow cipher velvet "
         "glacier ember falcon quartz willow thunder").split()
SHARED = "You are a helpful assistant. Answer in one or two sentences, plainly. "

def rss_kib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

def one(rng):
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 400)))
    prompt = (SHARED if rng.random() < 0.5 else "") + "Tell me about " + words
    chat = rng.random() < 0.5
    body = {"max_tokens": rng.randint(8, 96), "stream": True, "temperature": rng.choice([0, 0.8])}
    if chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    drop_after = rng.randint(1, 20) if rng.random() < 0.1 else None
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return "error", f"{r.status}: {r.read()[:200]!r}"
        chunks, done = 0, False
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            if b'"error"' in data:
                return "error", data[:200].decode(errors="replace")
            chunks += 1
            if drop_after is not None and chunks >= drop_after:
                return "dropped", chunks
        return ("ok", chunks) if done else ("error", f"no [DONE] after {chunks} chunks")
    except Exception as e:  # a timeout or a reset is an error of the server's
        return "error", repr(e)
    finally:
        c.close()

def worker(seed):
    rng = random.Random(seed)
    while time.time() < end_at:
        kind, info = one(rng)
        with lock:
            count[kind] += 1
            if kind == "ok":
                count["tokens"] += info
            if kind == "error" and len(errors) < 20:
                errors.append(info)

threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(streams)]
t0 = time.time()
for t in threads:
    t.start()
samples = []
print("| t (s) | RSS (MiB) | done | dropped | errors | chunks/s |")
print("|---|---|---|---|---|---|")
last_tokens, last_t = 0, t0
while any(t.is_alive() for t in threads):
    time.sleep(10)
    now, rss = time.time(), rss_kib() / 1024
    samples.append(rss)
    with lock:
        c = dict(count)
    rate = (c["tokens"] - last_tokens) / (now - last_t)
    last_tokens, last_t = c["tokens"], now
    print(f"| {now - t0:.0f} | {rss:.1f} | {c['ok']} | {c['dropped']} | {c['error']} | {rate:.0f} |", flush=True)
for t in threads:
    t.join()

# Drops are noticed at the engine's next step: give it a moment, then read the pool.
kv = None
for _ in range(100):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/slots")
    kv = json.loads(c.getresponse().read())
    if not kv["slots"] and kv["kv_blocks"]["used"] == 0:
        break
    time.sleep(0.1)
third = max(1, len(samples) // 3)
middle, last = max(samples[third:2 * third] or samples), max(samples[-third:])
flat = last <= middle * 1.05
free = not kv["slots"] and kv["kv_blocks"]["used"] == 0
print(f"\n{count['ok']} streams finished, {count['dropped']} dropped on purpose, "
      f"{count['error']} errors; KV blocks used at the end: {kv['kv_blocks']['used']}, "
      f"requests held: {len(kv['slots'])}")
print(f"RSS: start {samples[0]:.1f} MiB, middle third max {middle:.1f} MiB, last third max {last:.1f} MiB")
for e in errors:
    print("error:", e)
ok = count["error"] == 0 and free and flat
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
