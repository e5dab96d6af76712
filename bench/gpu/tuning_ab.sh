#!/usr/bin/env bash
# GPT-2 small: how max-autotune times its candidates, against reduce-overhead, on one GPU in one device
# call: bench/gpu/tuning_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. the attention and generated-product GPU tests (a failure ends the call), then CudaGpu* and CudaGpuGraphs*;
#   2. a fresh-cache run of each build with PROTEAN_LOGS=graphs (OUTDIR/NAME.log: the tuning lines and
#      the `new sizes` lines), each build with a cache directory of its own:
#      ro      reduce-overhead, the default buckets;
#      mg      max-autotune, candidates timed inside a captured graph (PROTEAN_AUTOTUNE_TIMING=graph,
#              the default);
#      mc      max-autotune, candidates timed by stream launches, cuBLASLt's after an L2 flush
#              (PROTEAN_AUTOTUNE_TIMING=cold, the timing before);
#      BUILDS (default "ro mg mc") picks them; b32 (reduce-overhead with
#      PROTEAN_BUCKETS=pow2=128,step=32), m16 (max-autotune timed in graphs over 16 of cuBLASLt's
#      algorithms, PROTEAN_AUTOTUNE_BLAS_ALGOS=16), m0 (max-autotune without the one-kernel
#      algorithms, PROTEAN_AUTOTUNE_BLAS_ONE_KERNEL=0) and r2 (reduce-overhead with warp-per-row
#      kernels of 2 rows a block, PROTEAN_CUDA_WARP_ROWS_PER_BLOCK=2) are also known;
#   3. ROUNDS rounds (default 3) of the builds from their caches (the tuning table read, nothing timed),
#      the order rotating by round;
#   4. torch.compile reduce-overhead on the same lengths.
# OUTDIR: steps.log, tests.log, *_fresh.log, runs/NAME.json, gpt2_runs.json, gpt2_torch.json
# (bench/gpu/tuning_merge.py OUTDIR RESULT.json COMMIT makes one results file of them).
set -uo pipefail
OUT=${1:?usage: bench/gpu/tuning_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step, gpt2_steady, gpu_tests_gated
gpu_setup "$OUT"
gpu_tests_gated "$OUT/tests.log" 'CudaGpu.*Attention*:CudaGpu.GeneratedProducts*' 150 || exit 0
gpt2_model
RUNS=$OUT/runs  # under OUT: what finished comes back even if the call is cut short
mkdir -p "$RUNS"
rm -rf /tmp/pc-tab-*
run_build() {  # run_build BUILD NAME [ENV...]
  local b=$1 name=$2
  shift 2
  case $b in
    ro) gpt2_steady "$name" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-ro "$@" ;;
    mg) gpt2_steady "$name" max-autotune 240 PROTEAN_CACHE_DIR=/tmp/pc-tab-mg PROTEAN_AUTOTUNE_TIMING=graph "$@" ;;
    mc) gpt2_steady "$name" max-autotune 240 PROTEAN_CACHE_DIR=/tmp/pc-tab-mc PROTEAN_AUTOTUNE_TIMING=cold "$@" ;;
    r2) gpt2_steady "$name" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-r2 PROTEAN_CUDA_WARP_ROWS_PER_BLOCK=2 "$@" ;;
    m0) gpt2_steady "$name" max-autotune 240 PROTEAN_CACHE_DIR=/tmp/pc-tab-m0 PROTEAN_AUTOTUNE_BLAS_ONE_KERNEL=0 "$@" ;;
    m16) gpt2_steady "$name" max-autotune 240 PROTEAN_CACHE_DIR=/tmp/pc-tab-m16 PROTEAN_AUTOTUNE_BLAS_ALGOS=16 "$@" ;;
    b32) gpt2_steady "$name" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-b32 PROTEAN_BUCKETS=pow2=128,step=32 "$@" ;;
  esac
}
read -r -a builds <<< "${BUILDS:-ro mg mc}"
for b in "${builds[@]}"; do
  run_build $b "${b}_fresh" PROTEAN_LOGS=graphs
  grep -h "max-autotune\|new sizes\|new bucket\|recorded" "/tmp/${b}_fresh.log" > "$OUT/${b}_fresh.log"
done
n=${#builds[@]}
for round in $(seq 1 "${ROUNDS:-3}"); do
  for i in $(seq 0 $((n - 1))); do  # round r starts at build r-1: each build runs first once in n rounds
    b=${builds[$(((i + round - 1) % n))]}
    run_build "$b" "${b}_$round"
  done
done
step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
  > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
