#!/usr/bin/env bash
# One call on a lent GPU machine (issues #22, #38): validate CUDA and WebGPU against the CPU, greedy
# tokens against the CPU, decode speed against the measured copy bandwidth.
#
#   scripts/gpu/device-check.sh [STEP...]     (default: every step, in priority order)
#
# Expects, in the repository root: .dev/kiln (a stripped release build made elsewhere),
# .dev/tok.gguf (`random-gguf.py template` of SmolLM2's GGUF), .whl/gguf-*.whl and, for the
# WebGPU steps, .gl/*.deb (the Vulkan loader; the device tool's README says how to fetch them).
# Every step runs under its own time cap and within KILN_GPU_DEADLINE seconds (default 480: the battery fits a 9-minute call)
# from the start; logs go to one archive, $OUT/logs.tgz, with $OUT/summary.txt beside it.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/kiln-gpu-out}
LOGS=/tmp/kiln-gpu-logs
MODELS=/tmp/kiln-gpu-models
mkdir -p "$OUT" "$LOGS" "$MODELS"
K=$ROOT/.dev/kiln
T0=$(date +%s)
DEADLINE=${KILN_GPU_DEADLINE:-480}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; }
# run NAME CAP CMD...: the command under min(CAP, time left), output in $LOGS/NAME.log.
run() {
    local name=$1 cap=$2 t
    shift 2
    t=$(left)
    [ "$t" -lt "$cap" ] && cap=$t
    if [ "$cap" -le 5 ]; then
        say "$name: skipped (deadline)"
        return 99
    fi
    local s=$(date +%s)
    timeout -k 5 "$cap" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    say "$name: rc=$rc $(($(date +%s) - s))s"
    pack
    return $rc
}

# NVRTC and the headers: the toolkit's, else those of PyTorch's pip packages (nvidia/cu13).
if [ -z "${KILN_CUDA_ROOT:-}" ]; then
    KILN_CUDA_ROOT=/usr/local/cuda
    if [ ! -e $KILN_CUDA_ROOT/include/cuda_fp4.h ]; then
        KILN_CUDA_ROOT=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null)
    fi
fi
export KILN_CUDA_ROOT
export KILN_CACHE_DIR=/tmp/kiln-cache
export RUST_BACKTRACE=1
# validate opens the backend unchecked; every other command skips the start-up self-check (the
# comparisons below catch what it would).
export KILN_CUDA_SELF_CHECK=0

setup() {
    {
        nvidia-smi
        nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu --format=csv
        nproc
        ls "$KILN_CUDA_ROOT"/lib64/libnvrtc* "$KILN_CUDA_ROOT"/include/cuda_fp4.h
        "$KILN_CUDA_ROOT"/bin/nvcc --version | tail -2
        python3 - <<'EOF'
import torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); x.random_(0, 255)
y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
ts = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); y.copy_(x); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
ts.sort(); ms = ts[len(ts) // 2]
print(f"torch copy 2 GiB: median {ms:.3f} ms, {2 * x.numel() / ms / 1e6:.0f} GB/s read+written")
# The bf16 tensor-core rate prefill is judged against: 8192³ on random data, median of 10.
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ b
ts = []
for _ in range(10):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); a @ b; e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1))
ts.sort(); ms = ts[len(ts) // 2]
print(f"torch bf16 matmul 8192^3: median {ms:.3f} ms, {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")
EOF
    } >"$LOGS/setup.log" 2>&1
    grep -E "GB/s|TFLOP/s|NVIDIA H|release" "$LOGS/setup.log" | tee -a "$SUMMARY"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl \
        >>"$LOGS/setup.log" 2>&1
}

# Random-weight Llama-shaped checkpoints, written in the background (one process each) while
# the GPU checks run.
models() {
    local g="python3 scripts/gpu/random-gguf.py make --template .dev/tok.gguf --head-type q6_k"
    # KILN_GPU_SMALL=1: toy sizes, to try this script on a machine without a GPU.
    [ "${KILN_GPU_SMALL:-0}" = 1 ] && g="$g --shrink 8"
    (
        export PYTHONPATH=/tmp/site
        $g --out $MODELS/llama-0.3b-q4_k.gguf --hidden 1024 --layers 16 --ffn 4096 --heads 16 --kv-heads 4 --type q4_k &
        $g --out $MODELS/llama-1b-q4_k.gguf --hidden 2048 --layers 16 --ffn 8192 --heads 32 --kv-heads 8 --type q4_k &
        $g --out $MODELS/llama-3b-q4_k.gguf --hidden 3072 --layers 28 --ffn 8192 --heads 24 --kv-heads 8 --type q4_k &
        $g --out $MODELS/llama-8b-q4_k.gguf --hidden 4096 --layers 32 --ffn 14336 --heads 32 --kv-heads 8 --type q4_k &
        $g --out $MODELS/llama-3b-nvfp4.gguf --hidden 3072 --layers 28 --ffn 8192 --heads 24 --kv-heads 8 --type nvfp4 &
        $g --out $MODELS/llama-1b-bf16.gguf --hidden 2048 --layers 16 --ffn 8192 --heads 32 --kv-heads 8 --type bf16 &
        wait
        touch $MODELS/done
    ) >"$LOGS/models.log" 2>&1 &
}
wait_models() {
    while [ ! -f $MODELS/done ] && [ "$(left)" -gt 10 ]; do sleep 1; done
    cat "$LOGS/models.log" >>"$SUMMARY"
}

validate_cuda() {
    run validate-cuda 200 "$K" validate --backend cuda
    grep -E "passed|FAIL|fail" "$LOGS/validate-cuda.log" | tail -15 | tee -a "$SUMMARY"
}

# greedy NAME MODEL BACKEND...: 16 greedy tokens on the CPU and on each backend, compared.
greedy() {
    local name=$1 model=$2
    shift 2
    local prompt=${GREEDY_PROMPT:-The quick brown fox}
    run "greedy-$name-cpu" 60 "$K" run -m "$model" --backend cpu --json --ignore-eos -n 16 --temp 0 "$prompt"
    for b in "$@"; do
        # The CPU's f32 cache on the GPU too: with the GPU default (f16) near-ties may flip.
        run "greedy-$name-$b" 60 "$K" run -m "$model" --backend "$b" --strict --kv-type f32 --json --ignore-eos -n 16 --temp 0 "$prompt"
        python3 - "$LOGS/greedy-$name-cpu.log" "$LOGS/greedy-$name-$b.log" <<'EOF' | tee -a "$SUMMARY"
import json, sys
def run(p):
    for line in open(p, errors="replace"):
        if line.startswith("{"):
            return json.loads(line)
    return None
a, b = run(sys.argv[1]), run(sys.argv[2])
name = sys.argv[2].rsplit("/", 1)[-1][:-4]
if a is None or b is None:
    print(f"{name}: NO OUTPUT")
else:
    a, g, b = a["tokens"], b.get("graph_steps", 0), b["tokens"]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    print(f"{name}: {'EQUAL' if a == b else f'DIFFER at {same}'} ({len(b)} tokens, {g} steps replayed from graphs)")
EOF
    done
}

greedy_tiny() {
    local b
    for m in llama qwen3 gemma3 qwen3_5 qwen3_5_moe gemma4 gemma4_moe; do
        greedy "$m" tests/fixtures/hf/$m "$@"
    done
    for m in qwen3_5 qwen3_5_moe gemma4 gemma4_moe; do
        greedy "gguf-$m" tests/fixtures/hf/gguf/$m.gguf "$@"
    done
}

bench() {
    local name=$1 model=$2 backend=$3
    shift 3
    run "bench-$name-$backend" 90 "$K" bench -m "$model" --backend "$backend" -p 512 -n 128 -r 2 "$@"
    grep -E "^\||roofline" "$LOGS/bench-$name-$backend.log" | grep -v -- "---" | tee -a "$SUMMARY"
}

vulkan() {
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    if [ ! -e /usr/share/vulkan/icd.d/nvidia_icd.json ] && [ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    fi
    "$K" info 2>&1 | grep -i -E "wgpu|vulkan|cuda" | head -8 | tee -a "$SUMMARY"
}

# Per-kernel time and DRAM traffic of decode steps: `kiln run` of a few tokens, the kernels
# after the prefill's, once per kernel variant of KILN_GPU_NCU_VARIANTS (space-separated
# KILN_CUDA_DEFINES values; "default" is the built-in one), at the card's own clocks.
ncu_decode() {
    wait_models
    local ncu v log had=${KILN_CUDA_DEFINES-__unset__}
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for v in ${KILN_GPU_NCU_VARIANTS:-default MV_X8=0}; do
        log=ncu-decode-3b-q4_k-$v
        say "== ncu, kernels $v"
        if [ "$v" = default ]; then unset KILN_CUDA_DEFINES; else export KILN_CUDA_DEFINES=$v; fi
        run "$log" 90 "$ncu" --clock-control none --launch-skip 1200 --launch-count 400 \
            --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active \
            "$K" run -m $MODELS/llama-3b-q4_k.gguf --backend cuda --ignore-eos -n 8 --temp 0 "The quick brown fox"
        python3 - "$LOGS/$log.log" <<'EOF2' | tee -a "$SUMMARY"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1], errors="replace") if l.startswith('"'))]
if len(rows) < 3:
    print("ncu: no rows"); sys.exit()
h = rows[0]; data = rows[2:]
col = {n: h.index(n) for n in h}
def num(r, n):
    try: return float(r[col[n]].replace(",", ""))
    except (KeyError, ValueError): return 0.0
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
for r in data:
    a = agg[r[col["Kernel Name"]][:40]]
    a[0] += 1; a[1] += num(r, "gpu__time_duration.sum"); a[2] += num(r, "dram__bytes_read.sum")
    a[3] = num(r, "launch__registers_per_thread"); a[4] += num(r, "sm__warps_active.avg.pct_of_peak_sustained_active")
tot = sum(a[1] for a in agg.values())
print(f"ncu: {len(data)} kernels, total time {tot:.0f} (units: {rows[1][col['gpu__time_duration.sum']]}, read {rows[1][col['dram__bytes_read.sum']]})")
for k, (n, t, b, regs, occ) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:10]:
    gbs = b / t if t else 0.0
    print(f"  {k:40s} n={n:4d} time={t:10.0f} read={b:12.0f} GB/s={gbs:7.1f} regs={regs:.0f} warps%={occ / n:5.1f}")
EOF2
    done
    # The caller's knobs again (a later step such as ncu_detail profiles what the caller set).
    if [ "$had" = __unset__ ]; then unset KILN_CUDA_DEFINES; else export KILN_CUDA_DEFINES=$had; fi
}

sanitize() {
    local tool=$1
    # KILN_GPU_SAN_FILTER: only the validate cases whose op or label holds one of its words
    # (a run each); KILN_GPU_SAN_DEFINES: the kernels' knobs (KILN_CUDA_DEFINES) to check.
    local f
    for f in ${KILN_GPU_SAN_FILTER:-all}; do
        run "sanitizer-$tool-$f" 150 env ${KILN_GPU_SAN_DEFINES:+KILN_CUDA_DEFINES=$KILN_GPU_SAN_DEFINES} compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 50 \
            "$K" validate --backend cuda -q $([ "$f" != all ] && echo --filter "$f")
        grep -E "SUMMARY|passed|Error|Invalid" "$LOGS/sanitizer-$tool-$f.log" | head -12 | tee -a "$SUMMARY"
    done
}

steps=${*:-"setup models greedy_tiny_cuda validate_cuda greedy_big ab sanitize_memcheck"}
for s in $steps; do
    case $s in
        setup) setup ;;
        models) models ;;
        validate_cuda) validate_cuda ;;
        greedy_tiny_cuda) greedy_tiny cuda ;;
        greedy_long)
            # A 147-token prompt: decode steps past 128 keys, where the paged decode kernel
            # splits the key range (scratch and combine inside the replayed graph).
            GREEDY_PROMPT=$(for i in $(seq 0 11); do printf 'the quick brown fox jumps over the lazy dog %d, ' "$i"; done)
            export GREEDY_PROMPT
            for m in llama qwen3 gemma3 qwen3_5 qwen3_5_moe gemma4 gemma4_moe; do
                greedy "long-$m" tests/fixtures/hf/$m cuda
            done
            unset GREEDY_PROMPT
            ;;
        greedy_tiny_wgpu) greedy_tiny wgpu ;;
        bench_cuda)
            wait_models
            bench 0.3b-q4_k $MODELS/llama-0.3b-q4_k.gguf cuda
            bench 1b-q4_k $MODELS/llama-1b-q4_k.gguf cuda
            bench 3b-q4_k $MODELS/llama-3b-q4_k.gguf cuda
            bench 3b-nvfp4 $MODELS/llama-3b-nvfp4.gguf cuda
            bench 1b-bf16 $MODELS/llama-1b-bf16.gguf cuda
            ;;
        greedy_big)
            wait_models
            greedy 1b-q4_k $MODELS/llama-1b-q4_k.gguf cuda
            ;;
        vulkan_all)
            vulkan
            run validate-wgpu 120 "$K" validate --backend wgpu
            grep -E "passed|FAIL" "$LOGS/validate-wgpu.log" | tail -8 | tee -a "$SUMMARY"
            greedy llama tests/fixtures/hf/llama wgpu
            greedy 1b-q4_k $MODELS/llama-1b-q4_k.gguf wgpu
            bench 3b-q4_k $MODELS/llama-3b-q4_k.gguf wgpu
            ;;
        ab)
            # Before/after, interleaved in one run: each variant is a set of environment
            # assignments joined by '+' ("-" for none; KILN_GPU_AB_VARIANTS, space-separated),
            # over the checkpoints of KILN_GPU_AB_MODELS, 3 rounds of `kiln bench` with
            # KILN_GPU_AB_ARGS (default: pp512 and tg128). A variant that sets
            # KILN_CUDA_DEFINES= (empty) runs the built-in knobs whatever the caller exported.
            wait_models
            ab_models=${KILN_GPU_AB_MODELS:-1b-q4_k 3b-q4_k 8b-q4_k}
            # Default: the f32 decode kernels for Q4_K (MV_X8=0), the built-in knobs (the int8
            # activation kernels), those without programmatic dependent launch.
            ab_variants=${KILN_GPU_AB_VARIANTS:-KILN_CUDA_DEFINES=MV_X8=0 KILN_CUDA_DEFINES= KILN_CUDA_DEFINES=PDL=0}
            for m in $ab_models; do
                for round in 1 2 3; do
                    for v in $ab_variants; do
                        tag=$(echo "$v" | tr -c 'A-Za-z0-9=,\n' '_')
                        envs=()
                        [ "$v" != - ] && IFS=+ read -r -a envs <<<"$v"
                        run "ab-$m-$tag-$round" 60 env ${envs[@]+"${envs[@]}"} "$K" bench -m $MODELS/llama-$m.gguf --backend cuda ${KILN_GPU_AB_ARGS:--p 512 -n 128 -r 1}
                        f="$LOGS/ab-$m-$tag-$round.log"
                        echo "$m $v r$round: $(awk -F'|' '/pp[0-9]+|tg[0-9]+/ {t=$6; sub(/ ±.*/, "", t); printf "%s%s ", $5, t}' "$f")$(grep -o 'ran at [0-9]*%' "$f") $(grep -o '[0-9]* kernel launches.*took' "$f" | sed 's/kernel launches a generated token, enqueued in/launches,/') $(grep -o 'graphs: [0-9a-z ]*' "$f" | head -1)" | tee -a "$SUMMARY"
                    done
                done
            done
            ;;
        ncu_decode) ncu_decode ;;
        ncu_detail)
            # Why the hottest decode mat-vecs stall: ncu's warp-state, scheduler, occupancy
            # and memory sections on a few of them (3 B Q4_K, decode steps replayed as graphs),
            # once per kernel set of KILN_GPU_DETAIL_VARIANTS (KILN_CUDA_DEFINES values,
            # "default" for the caller's).
            wait_models
            ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
            for v in ${KILN_GPU_DETAIL_VARIANTS:-default}; do
                say "== ncu detail, kernels $v"
                d=${KILN_CUDA_DEFINES:-}; [ "$v" != default ] && d=$v
                log=ncu-detail-3b-q4_k-$v
                run "$log" 120 env KILN_CUDA_DEFINES=$d "$ncu" --clock-control none --graph-profiling node \
                    -k regex:'mat_vec' --launch-skip 300 --launch-count 6 \
                    --section SpeedOfLight --section Occupancy --section WarpStateStats \
                    --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
                    "$K" run -m $MODELS/llama-3b-q4_k.gguf --backend cuda --ignore-eos -n 24 --temp 0 "The quick brown fox"
                grep -E "^  [a-z_0-9]+_mat_vec|mat_vec_x8|Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|Registers Per|Theoretical Occupancy|L1/TEX Hit|L2 Hit" \
                    "$LOGS/$log.log" | head -90 | tee -a "$SUMMARY"
            done
            ;;
        concurrent)
            # Aggregate decode of 64 concurrent requests against one (8 B Q4_K), for each kernel
            # set of KILN_GPU_CONC_VARIANTS (KILN_CUDA_DEFINES values, "default" for none;
            # default: the f32 FMA prefill tile and the tensor-core one, which a batch of more
            # than 4 rows runs), KILN_GPU_CONC_ARGS to `kiln bench` (default -p 16 -n 128).
            wait_models
            for v in ${KILN_GPU_CONC_VARIANTS:-default MM_TC=1,FA_TC=1}; do
                d=""; [ "$v" != default ] && d=$v
                run "concurrent-8b-q4_k-$v" 150 env KILN_CUDA_DEFINES=$d "$K" bench -m $MODELS/llama-8b-q4_k.gguf --backend cuda --concurrent 64 ${KILN_GPU_CONC_ARGS:--p 16 -n 128} -r 1
                echo "$v: $(grep -E "^\| llama" "$LOGS/concurrent-8b-q4_k-$v.log" | tr '\n' ' ')" | tee -a "$SUMMARY"
            done
            ;;
        knobs)
            # The kernels of KILN_GPU_KNOBS (a KILN_CUDA_DEFINES value) on the card: the validate
            # cases whose op or label holds a word of KILN_GPU_KNOBS_FILTER (default "mat_mul
            # attention", a run each), and greedy tokens of the Q4_K Llama fixture and the
            # 1.17 B Q4_K checkpoint against the CPU's.
            wait_models
            export KILN_CUDA_DEFINES=${KILN_GPU_KNOBS:-}
            say "== knobs ${KILN_CUDA_DEFINES}"
            for f in ${KILN_GPU_KNOBS_FILTER:-mat_mul attention}; do
                run "validate-cuda-knobs-$f" 90 "$K" validate --backend cuda -q --filter "$f"
                grep -E "passed|FAIL" "$LOGS/validate-cuda-knobs-$f.log" | tail -8 | tee -a "$SUMMARY"
            done
            greedy knobs-q4k-fixture tests/fixtures/hf/gguf/llama_q4_k.gguf cuda
            greedy knobs-1b-q4_k $MODELS/llama-1b-q4_k.gguf cuda
            unset KILN_CUDA_DEFINES
            ;;
        pp2048)
            # Prefill of 2048 tokens (8 B Q4_K, 1 B BF16), against the bf16 rate of setup's
            # matmul: the kernel sets of KILN_GPU_PP_VARIANTS (KILN_CUDA_DEFINES values,
            # "default" for none; default: the f32 FMA tiles, the tensor-core matmul tiles at 3
            # exact activation parts, with the tensor-core attention too, and at 2 parts)
            # interleaved, 2 rounds each, so the before/after of the tiles is one run.
            wait_models
            for round in 1 2; do
                for v in ${KILN_GPU_PP_VARIANTS:-default MM_TC=1 MM_TC=1,FA_TC=1 MM_TC=1,MM_PARTS=2}; do
                    for m in 8b-q4_k 1b-bf16; do
                        d=""; [ "$v" != default ] && d=$v
                        run "pp2048-$m-$v-$round" 90 env KILN_CUDA_DEFINES=$d "$K" bench -m $MODELS/llama-$m.gguf --backend cuda -p 2048 -n 0 -r 1
                        echo "$m $v r$round: $(grep -E "pp2048" "$LOGS/pp2048-$m-$v-$round.log" | head -1)" | tee -a "$SUMMARY"
                    done
                done
            done
            ;;
        variants)
            # The decode mat-vec's tuning knobs (formats.cuh), each validated and timed.
            wait_models
            variants=${KILN_GPU_VARIANTS:-MV_DEPTH=2,MV_X_EARLY=1 MV_DEPTH=3,MV_X_EARLY=1 MV_DEPTH=2,MV_X_EARLY=0 MV_DEPTH=3,MV_X_EARLY=0 MV_DEPTH=4,MV_X_EARLY=0}
            for v in $variants; do
                export KILN_CUDA_DEFINES=$v
                tag=$(echo "$v" | tr -d 'MV_DEPTHXRLY=' | tr ',' '-')
                say "== variant $v"
                run "validate-cuda-v$tag" 90 "$K" validate --backend cuda -q
                grep -E "passed|FAIL" "$LOGS/validate-cuda-v$tag.log" | tail -4 | tee -a "$SUMMARY"
                for m in 3b-q4_k 1b-bf16 3b-nvfp4; do
                    run "bench-$m-v$tag" 40 "$K" bench -m $MODELS/llama-$m.gguf --backend cuda -p 16 -n 128 -r 2
                    grep -E "tg128" "$LOGS/bench-$m-v$tag.log" | tee -a "$SUMMARY"
                done
                greedy "1b-q4_k-v$tag" $MODELS/llama-1b-q4_k.gguf cuda
            done
            unset KILN_CUDA_DEFINES
            ;;
        profile_cuda)
            wait_models
            run profile-3b-q4_k-cuda 60 "$K" bench -m $MODELS/llama-3b-q4_k.gguf --backend cuda -p 512 -n 128 -r 1 --profile
            tail -30 "$LOGS/profile-3b-q4_k-cuda.log" | tee -a "$SUMMARY"
            ;;
        bench_wgpu)
            vulkan
            wait_models
            for m in 0.3b-q4_k 1b-q4_k 3b-q4_k 3b-nvfp4 1b-bf16; do bench $m $MODELS/llama-$m.gguf wgpu; done
            ;;
        sanitize_memcheck) sanitize memcheck ;;
        sanitize_racecheck) sanitize racecheck ;;
        *) say "unknown step $s" ;;
    esac
done
say "total $(($(date +%s) - T0))s"
pack
