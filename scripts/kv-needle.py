#!/usr/bin/env python3
"""Needle retrieval through a long context with each KV cache type (README, Quantized KV cache).

    scripts/kv-needle.py --model M [--ctx 8192] [--facts 20] [--backend cpu] KV...

KV: a cache setting, `f16`, `K/V` (e.g. `q8_0/tq3`), `K/V@LAYERS` (with `--kv-type-layers
LAYERS`) or `auto`; the first is the reference.
Facts ("The code word of cabinet 7 is walnut.", or with `--keys names` "The code word of the
brass lantern is walnut.") are planted at even spacing through the first 40 % of a haystack of
tests/fixtures/text/ppl.txt filling the context; each is then asked for at the end ("... cabinet
7 is") and the greedy next word is the answer. One `kiln serve` per
setting (its prefix cache computes the long context once for all questions). Prints each
setting's answers, how many are right and how many equal the reference's. Standard library
only; needs a release build (target/release/kiln).
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = [
    "walnut", "copper", "meadow", "lantern", "harbor", "violet", "pepper", "glacier",
    "saddle", "orchard", "thimble", "falcon", "marble", "cobalt", "willow", "biscuit",
    "canyon", "ember", "juniper", "quartz", "velvet", "tundra", "sparrow", "garnet",
]
# Keys for `--keys names`: things a story could hold, each named by words no other key shares.
NAMES = [
    "brass lantern", "oak wardrobe", "red bicycle", "stone well", "silver kettle",
    "wooden sled", "glass aquarium", "iron anvil", "paper kite", "velvet curtain",
    "clay teapot", "leather saddlebag", "copper telescope", "wicker basket", "marble fountain",
    "tin drum", "cedar chest", "porcelain doll", "steam engine", "feather pillow",
    "rope ladder", "ivory chess set", "bronze bell", "canvas tent",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=3600):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        sys.exit(f"{path}: HTTP {e.code}: {e.read()[:500]!r}")


def start(args, kv, port, log):
    cmd = [args.kiln, "serve", "-m", args.model, "--backend", args.backend, "--ctx",
           str(args.ctx), "--port", str(port), "--max-batch", "1", "--no-webui"]
    if kv == "auto":
        cmd += ["--kv-type", "auto"]
    else:
        kv, _, layers = kv.partition("@")
        k, _, v = kv.partition("/")
        cmd += ["--kv-type-k", k, "--kv-type-v", v or k]
        if layers:
            cmd += ["--kv-type-layers", layers]
    p = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    deadline = time.time() + 1800
    while time.time() < deadline:
        if p.poll() is not None:
            sys.exit(f"kiln serve exited ({kv}); see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return p
        except Exception:
            time.sleep(1)
    os.killpg(p.pid, signal.SIGTERM)
    sys.exit(f"kiln serve did not come up ({kv})")


def haystack(port, n_tokens, facts):
    """The text with the facts planted, about n_tokens long (by the server's tokenizer)."""
    with open(os.path.join(ROOT, "tests/fixtures/text/ppl.txt"), encoding="utf-8") as f:
        text = f.read()
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]
    out, count = [], 0
    for p in paras:
        n = len(post(port, "/tokenize", {"content": p + "\n\n"})["tokens"])
        if count + n > n_tokens:
            break
        out.append(p)
        count += n
    early = max(1, int(len(out) * 0.4))
    for i, (key, word) in enumerate(facts):
        at = 1 + i * (early - 1) // max(1, len(facts))
        out[at] = out[at] + f" The code word of {key} is {word}."
    return "\n\n".join(out) + "\n\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--facts", type=int, default=20)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--keys", choices=["numbers", "names"], default="numbers",
                    help="what the facts are about: numbered cabinets, or named things")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target/release/kiln"))
    ap.add_argument("kv", nargs="+")
    args = ap.parse_args()
    rng = random.Random(20261128)
    if args.facts > min(len(WORDS), len(NAMES)):
        sys.exit(f"--facts: at most {min(len(WORDS), len(NAMES))}")
    if args.keys == "names":
        keys = ["the " + k for k in rng.sample(NAMES, args.facts)]
    else:
        keys = [f"cabinet {c}" for c in rng.sample(range(10, 100), args.facts)]
    words = rng.sample(WORDS, args.facts)
    facts = list(zip(keys, words))
    ref = None
    text = None
    for kv in args.kv:
        port = free_port()
        log = open(f"/tmp/kiln-needle-{port}.log", "w")
        p = start(args, kv, port, log)
        try:
            if text is None:
                # Room for the facts, a question and its answer after the haystack.
                text = haystack(port, args.ctx - 16 * len(facts) - 96, facts)
            answers = []
            t0 = time.time()
            for key, _ in facts:
                prompt = text + f"Question: what is the code word of {key}?\nAnswer: The code word of {key} is"
                r = post(port, "/v1/completions", {
                    "prompt": prompt, "max_tokens": 4, "temperature": 0})
                got = r["choices"][0]["text"].strip().split()
                answers.append(got[0].strip(".,;:!?\"'").lower() if got else "")
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()
        right = sum(a == w for a, (_, w) in zip(answers, facts))
        same = "" if ref is None else f", {sum(a == b for a, b in zip(answers, ref))}/{len(facts)} as {args.kv[0]}"
        print(f"{kv}: {right}/{len(facts)} right{same} ({time.time() - t0:.0f} s)  {' '.join(answers)}",
              flush=True)
        if ref is None:
            ref = answers


if __name__ == "__main__":
    main()
