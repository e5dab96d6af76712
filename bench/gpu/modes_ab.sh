#!/usr/bin/env bash
# GPT-2 small at its 12 lengths, on one GPU in one device call: bench/gpu/modes_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. the attention and generated-product GPU tests (a failure ends the call), then CudaGpu* and CudaGpuGraphs*;
#   2. ROUNDS (default 2) rounds alternating four builds of the one tree:
#      reduce   reduce-overhead, the default buckets (64-wide above 64);
#      exact    reduce-overhead with PROTEAN_BUCKETS=exact (a graph per length, the cuBLASLt products at
#               the exact row count);
#      autotune max-autotune (cuBLASLt's algorithms timed per bucket at its upper bound; round 2 starts
#               from the tuning table round 1 wrote);
#      rows512  reduce-overhead with PROTEAN_CUDA_GENERATED_PRODUCT_ROWS=512 (the generated Hopper
#               products, captured at the bucket's upper bound like cuBLASLt's, up to 512 rows instead
#               of 128);
#      in round 1 also the default with PROTEAN_LOGS=graphs (the `new sizes` lines: what a new length
#      patches) and torch.compile reduce-overhead.
# OUTDIR: steps.log, tests.log, new_sizes.log, runs/NAME.json (one per run), gpt2_runs.json, gpt2_torch.json.
set -uo pipefail
OUT=${1:?usage: bench/gpu/modes_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step, gpt2_steady, gpu_tests_gated
gpu_setup "$OUT"
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
gpu_tests_gated "$OUT/tests.log" 'CudaGpu.*Attention*:CudaGpu.GeneratedProducts*' 150 || exit 0
gpt2_model
RUNS=$OUT/runs  # under OUT: what finished comes back even if the call is cut short
mkdir -p "$RUNS"
for round in $(seq 1 "${ROUNDS:-2}"); do
  gpt2_steady "reduce_$round" reduce-overhead 60
  gpt2_steady "exact_$round" reduce-overhead 60 PROTEAN_BUCKETS=exact
  gpt2_steady "autotune_$round" max-autotune 240
  gpt2_steady "rows512_$round" reduce-overhead 60 PROTEAN_CUDA_GENERATED_PRODUCT_ROWS=512
  if [ "$round" = 1 ]; then
    gpt2_steady "logged_$round" reduce-overhead 60 PROTEAN_LOGS=graphs
    grep -h "new sizes\|new bucket" "/tmp/logged_$round.log" > "$OUT/new_sizes.log"
    step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
      > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
  fi
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
