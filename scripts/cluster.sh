#!/usr/bin/env bash
# Scale-out check: three `kiln serve` workers on loopback ports behind vllm-router (vLLM's router,
# installed from PyPI into a local folder), and what a router in front of kiln must see:
#   1. spread:   REQUESTS distinct requests through `--policy cache_aware` reach all three workers;
#   2. affinity: PREFIX requests sharing a long prefix land on one worker, which serves their
#                prefix from its cache (its kiln_prefix_cache_hit_tokens_total grows);
#   3. failover: one worker stopped with SIGSTOP in the middle of STOPPED requests costs the
#                clients no error (the router retries elsewhere), and after SIGCONT it takes
#                requests again.
# Prints the figures of each and exits non-zero if one fails.
#
#   scripts/cluster.sh
#
# Environment: REQUESTS (default 300), PREFIX (30), STOPPED (60), CONCURRENT (8), TOKENS (8),
# MODEL (alias or .gguf path; default smollm2-135m-instruct), KILN (binary; default
# target/release/kiln, built if missing), PORT (the router's; workers take the next three;
# default 18500), ROUTER_DIR (where vllm-router is installed; default target/vllm-router, and
# `pip install --target` puts it there when it is missing), THREADS (per worker, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."

requests=${REQUESTS:-300}
prefix_n=${PREFIX:-30}
stopped_n=${STOPPED:-60}
conc=${CONCURRENT:-8}
tokens=${TOKENS:-8}
model=${MODEL:-smollm2-135m-instruct}
kiln=${KILN:-target/release/kiln}
base=${PORT:-18500}
router_dir=${ROUTER_DIR:-target/vllm-router}
threads=${THREADS:-1}

[ -x "$kiln" ] || cargo build --release --quiet
if [ ! -x "$router_dir/bin/vllm-router" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$router_dir" \
        vllm-router==0.1.17 2>&1 | grep -v -i "warning\|dependency resolver\|requires\|incompatible" || true
fi
[ -x "$router_dir/bin/vllm-router" ] || { echo "vllm-router is not installed in $router_dir" >&2; exit 2; }

pids=()
cleanup() {
    # A worker left stopped would never see the TERM.
    for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Starts "$@" (its port given as the word PORT) on $1's port and waits for /health; a port
# another process took in the meantime (the log says so) moves it to a free-looking other one,
# up to 5 tries. Sets `url` and appends the pid. Any other early exit prints the log's tail.
launch() {
    local log=$1 port=$2
    shift 2
    for _ in 1 2 3 4 5; do
        "${@/#PORT/$port}" >"$log" 2>&1 &
        local pid=$!
        url="http://127.0.0.1:$port"
        local up=0
        for _ in $(seq 600); do
            if ! kill -0 "$pid" 2>/dev/null; then up=2; break; fi
            if curl -sf --max-time 2 "$url/health" >/dev/null 2>&1; then up=1; break; fi
            sleep 0.1
        done
        if [ "$up" = 1 ]; then pids+=("$pid"); return 0; fi
        if [ "$up" = 0 ]; then kill "$pid" 2>/dev/null || true; echo "$url did not come up" >&2; exit 1; fi
        wait "$pid" 2>/dev/null || true
        if grep -qi "address already in use" "$log"; then
            echo "$url: port taken, trying another" >&2
            port=$((20000 + RANDOM % 12000))
            continue
        fi
        echo "$url: the process exited at start; the end of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    done
    echo "no free port after 5 tries" >&2
    exit 1
}

workers=()
for i in 1 2 3; do
    launch "target/cluster-worker-$i.log" $((base + i)) \
        "$kiln" serve -m "$model" -t "$threads" --backend cpu --max-batch 4 --port PORT
    workers+=("$url")
done
served=$(curl -sf "${workers[0]}/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

# Health checks every second, a worker out after one failure; a request that gets no answer in
# 5 s is retried on another worker.
PYTHONPATH="$router_dir" launch target/cluster-router.log "$base" \
    "$router_dir/bin/vllm-router" --host 127.0.0.1 --port PORT \
    --worker-urls "${workers[@]}" --policy cache_aware \
    --health-check-interval-secs 1 --health-check-timeout-secs 1 --health-failure-threshold 1 \
    --health-success-threshold 1 --request-timeout-secs 5 --retry-max-retries 3 \
    --log-level warning
base=${url##*:}

# Runs the phases against the router; the workers' /metrics tell where requests went.
python3 - "$base" "$served" "$requests" "$prefix_n" "$stopped_n" "$conc" "$tokens" \
    "${pids[1]}" "${workers[@]}" <<'PY'
import concurrent.futures as cf, json, os, re, signal, sys, threading, time, urllib.request

base, model = int(sys.argv[1]), sys.argv[2]
n_req, n_prefix, n_stopped, conc, tokens = map(int, sys.argv[3:8])
stop_pid, workers = int(sys.argv[8]), sys.argv[9:]
router = f"http://127.0.0.1:{base}"

def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0

def served(url):
    return metric(url, 'kiln_requests_total{status="length"}') + metric(url, 'kiln_requests_total{status="stop"}')

def counts():
    return [served(w) for w in workers]

def complete(prompt):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(router + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return -1

def run(prompts, workers_=conc):
    with cf.ThreadPoolExecutor(workers_) as ex:
        return list(ex.map(complete, prompts))

failed = []
words = "amber birch cedar delta ember fjord garnet harbor iris juniper kestrel lagoon".split()

# 1. Spread: distinct prompts (no shared prefix beyond a word or two).
before = counts()
statuses = run([f"{words[i % 12]} {i * 7919 % 10007} is a number; tell me about {words[(i * 5) % 12]}"
                for i in range(n_req)])
spread = [a - b for a, b in zip(counts(), before)]
ok = statuses.count(200)
print(f"spread: {ok}/{n_req} answered; per worker {[int(x) for x in spread]}")
if ok != n_req:
    failed.append(f"spread: {n_req - ok} requests failed ({sorted(set(statuses))})")
if min(spread) <= 0:
    failed.append("spread: a worker got no request")

# 2. Affinity: one long shared prefix, different endings, one after another.
shared = ("You are a careful assistant for a library. " +
          "The catalogue lists books by author, title, year and shelf; answer from it only. " * 6)
before, hits0 = counts(), [metric(w, "kiln_prefix_cache_hit_tokens_total") for w in workers]
statuses = run([shared + f"Question {i}: which shelf holds {words[i % 12]}?" for i in range(n_prefix)], 1)
got = [a - b for a, b in zip(counts(), before)]
hits = [metric(w, "kiln_prefix_cache_hit_tokens_total") - h for w, h in zip(workers, hits0)]
top = max(range(3), key=lambda i: got[i])
print(f"affinity: per worker {[int(x) for x in got]}, prefix-cache hit tokens {[int(x) for x in hits]}")
if statuses.count(200) != n_prefix:
    failed.append("affinity: requests failed")
if got[top] < 0.9 * n_prefix:
    failed.append(f"affinity: only {int(got[top])} of {n_prefix} on one worker")
if hits[top] <= 0:
    failed.append("affinity: no prefix-cache hits on that worker")

# 3. Failover: SIGSTOP worker 2 a moment into the run; SIGCONT after it.
def stopper():
    time.sleep(1.0)
    os.kill(stop_pid, signal.SIGSTOP)
t = threading.Thread(target=stopper)
t.start()
t0 = time.time()
statuses = run([f"Failover {i}: {words[i % 12]} and {words[(i + 3) % 12]}" for i in range(n_stopped)])
t.join()
errors = n_stopped - statuses.count(200)
print(f"failover: {statuses.count(200)}/{n_stopped} answered with worker 2 stopped "
      f"({time.time() - t0:.1f} s)")
if errors:
    failed.append(f"failover: {errors} client errors ({sorted(set(statuses))})")
os.kill(stop_pid, signal.SIGCONT)
rejoined = 0.0
deadline = time.time() + 60
while time.time() < deadline and rejoined <= 0:
    before = served(workers[1])
    run([f"Rejoin {i} {time.time()}: {words[i % 12]}" for i in range(12)])
    rejoined = served(workers[1]) - before
print(f"rejoin: worker 2 took {int(rejoined)} requests after SIGCONT")
if rejoined <= 0:
    failed.append("rejoin: worker 2 took no request after SIGCONT")

for f in failed:
    print("FAILED", f)
sys.exit(1 if failed else 0)
PY
