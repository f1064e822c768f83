#!/usr/bin/env bash
# Perplexity of a model for every K/V cache type pair, as a markdown table (README, KV cache).
#
#   scripts/kv-perplexity.sh MODEL [CTX] [CHUNKS] [BACKEND] [PAIRS]
#
# MODEL: a .gguf file or an alias; CTX tokens per chunk (default 512); CHUNKS at most this
# many chunks (default all); BACKEND cpu (default) or wgpu; PAIRS "all" (every pair of
# f16 q8_0 q4_0 tq4 tq3 tq2, default), "same" (K and V of one type) or a list of K/V pairs
# ("tq3t/f16 f16/tq3t"; a pair ending in +fit or +center runs with --kv-fit-keys or
# --kv-center-keys, "tq3/tq3+fit"). The text is
# tests/fixtures/text/ppl.txt; the f32 cache is the reference row and the base each run is
# compared with (change of perplexity with its standard error, KL divergence, same top
# token: `kiln perplexity --compare`). KV_TYPES="q8_0 tq3" limits the types; KILN the binary.
# Needs a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/kv-perplexity.sh MODEL [CTX] [CHUNKS] [BACKEND] [PAIRS]}
ctx=${2:-512}
chunks=${3:-}
backend=${4:-cpu}
pairs=${5:-all}
kiln=${KILN:-target/release/kiln}
types=${KV_TYPES:-"f16 q8_0 q4_0 tq4 tq3 tq2"}
extra=()
[ -n "$chunks" ] && extra+=(--chunks "$chunks")

base=$(mktemp /tmp/kiln-kv-base.XXXXXX)
out=$(mktemp /tmp/kiln-kv-out.XXXXXX)
trap 'rm -f "$base" "$out" "$out.err"' EXIT

# K V FLAG... -> "ppl bytes_per_token"; the run's output stays in $out.
ppl() {
  local k=$1 v=$2 p b
  shift 2
  "$kiln" perplexity -m "$model" --backend "$backend" --ctx "$ctx" "${extra[@]}" \
    -f tests/fixtures/text/ppl.txt --kv-type-k "$k" --kv-type-v "$v" "$@" >"$out" 2>"$out.err" ||
    { echo "kiln perplexity failed for K $k, V $v:" >&2; cat "$out.err" >&2; }
  p=$(sed -n 's/^ppl = //p' "$out")
  b=$("$kiln" info -m "$model" --backend cpu --kv-type-k "$k" --kv-type-v "$v" 2>/dev/null |
      sed -n 's/.* — \([0-9]*\) bytes per token.*/\1/p')
  echo "$p $b"
}

# The f32 run is the base every other run is compared with (kiln perplexity --compare).
read -r ref ref_b < <(ppl f32 f32 --save-base "$base")
[ -n "$ref" ] || exit 1
echo "| K | V | perplexity | change from f32 (± s.e. by chunk) | KL divergence from f32 | same top token | KV bytes per token |"
echo "|---|---|---|---|---|---|---|"
echo "| f32 | f32 | $ref | — | — | — | $ref_b |"
if [[ "$pairs" == */* ]]; then
  list=$pairs
else
  list=""
  for k in $types; do
    for v in $types; do
      [ "$pairs" = same ] && [ "$k" != "$v" ] && continue
      list+=" $k/$v"
    done
  done
fi
for kv in $list; do
    flags=()
    case $kv in
        *+fit) flags+=(--kv-fit-keys) kv=${kv%+fit} ;;
        *+center) flags+=(--kv-center-keys) kv=${kv%+center} ;;
    esac
    k=${kv%/*} v=${kv#*/}
    read -r p b < <(ppl "$k" "$v" --compare "$base" "${flags[@]}")
    [ -n "$p" ] || exit 1
    case ${flags[*]-} in
        --kv-fit-keys) k="$k, fitted" ;;
        --kv-center-keys) k="$k, centered" ;;
    esac
    d=$(sed -n 's/.*(ppl \([^ ]*\) %.*by chunk (± \([^ ]*\) %.*/\1 % ± \2 %/p' "$out")
    [ -n "$d" ] || d=$(sed -n 's/.*(ppl \([^ ]*\) % .*/\1 %/p' "$out")
    kl=$(sed -n 's/^KL divergence.*: mean \([^ ]*\) .*/\1/p' "$out")
    same=$(sed -n 's/^same most likely token: \([^ ]*\) .*/\1 %/p' "$out")
    echo "| $k | $v | $p | $d | $kl | $same | $b |"
done
