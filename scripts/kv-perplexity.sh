#!/usr/bin/env bash
# Perplexity of a model for every K/V cache type pair, as a markdown table (README, KV cache).
#
#   scripts/kv-perplexity.sh MODEL [CTX] [CHUNKS] [BACKEND] [PAIRS]
#
# MODEL: a .gguf file or an alias; CTX tokens per chunk (default 512); CHUNKS at most this
# many chunks (default all); BACKEND cpu (default) or wgpu; PAIRS "all" (every pair of
# f16 q8_0 q4_0 tq4 tq3 tq2, default) or "same" (K and V of one type). The text is
# tests/fixtures/text/ppl.txt; the f32 cache is the reference row. Needs a release build
# (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/kv-perplexity.sh MODEL [CTX] [CHUNKS] [BACKEND] [PAIRS]}
ctx=${2:-512}
chunks=${3:-}
backend=${4:-cpu}
pairs=${5:-all}
kiln=${KILN:-target/release/kiln}
types="f16 q8_0 q4_0 tq4 tq3 tq2"
extra=()
[ -n "$chunks" ] && extra+=(--chunks "$chunks")

ppl() { # K V -> "ppl bytes_per_token"
  local p b
  p=$("$kiln" perplexity -m "$model" --backend "$backend" --ctx "$ctx" "${extra[@]}" \
      -f tests/fixtures/text/ppl.txt --kv-type-k "$1" --kv-type-v "$2" 2>/dev/null |
      sed -n 's/^ppl = //p')
  b=$("$kiln" info -m "$model" --backend cpu --kv-type-k "$1" --kv-type-v "$2" 2>/dev/null |
      sed -n 's/.* — \([0-9]*\) bytes per token.*/\1/p')
  echo "$p $b"
}

read -r ref ref_b < <(ppl f32 f32)
echo "| K | V | perplexity | change from f32 | KV bytes per token |"
echo "|---|---|---|---|---|"
echo "| f32 | f32 | $ref | — | $ref_b |"
for k in $types; do
  for v in $types; do
    [ "$pairs" = same ] && [ "$k" != "$v" ] && continue
    read -r p b < <(ppl "$k" "$v")
    d=$(python3 -c "print(f'{($p / $ref - 1) * 100:+.2f} %')")
    echo "| $k | $v | $p | $d | $b |"
  done
done
