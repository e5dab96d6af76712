#!/usr/bin/env bash
# Generated products with K split over a cluster (GPT-2's FC2, k = 3072, up to 128 rows) against
# cuBLASLt's split kernel for them, on one GPU in one device call: bench/gpu/split_k_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. the generated products' GPU tests (a failure ends the call), then CudaGpu* and CudaGpuGraphs*;
#   2. GPT-2 small under reduce-overhead (protean_gpt2_bench --steady), ROUNDS (default 2) rounds
#      alternating PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K=1 and =0 (the default when it was written; now
#      2); in round 1 also the
#      default with PROTEAN_BUCKETS=step=32 and =exact (what a bucket's padding costs: the cuBLASLt
#      products of a bucket's graph run at its upper bound), then torch.compile reduce-overhead.
# OUTDIR: steps.log, tests.log, gpt2_runs.json, gpt2_torch.json.
set -uo pipefail
OUT=${1:?usage: bench/gpu/split_k_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD..., gpu_tests_gated
gpu_setup "$OUT"
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
gpu_tests_gated "$OUT/tests.log" 'CudaGpu.GeneratedProducts*:CudaGpu.SplitK*' 120 || exit 0
gpt2_model
RUNS=/tmp/protean-splitk-runs
mkdir -p "$RUNS"
bench() { local name=$1; shift; gpt2_steady "$name" reduce-overhead 60 "$@"; }  # NAME ENV...
for round in $(seq 1 "${ROUNDS:-2}"); do
  bench "split1_$round" PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K=1
  bench "split0_$round" PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K=0
  if [ "$round" = 1 ]; then
    bench "step32_$round" PROTEAN_BUCKETS=step=32
    bench "exact_$round" PROTEAN_BUCKETS=exact
    step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
      > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
  fi
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
