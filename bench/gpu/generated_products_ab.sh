#!/usr/bin/env bash
# Generated products (backend/cuda/hopper_gemm.h) against cuBLASLt for the same products, on one GPU in
# one device call: bench/gpu/generated_products_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. the cuda tests on the device (CudaGpu*, CudaGpuGraphs*), generated products on (the default);
#   2. GPT-2 small under reduce-overhead (protean_gpt2_bench --steady), two rounds alternating
#      PROTEAN_CUDA_GENERATED_PRODUCTS=1 and =0 (one warm cache each), then torch.compile reduce-overhead.
# OUTDIR: steps.log, tests.log, gpt2_runs.json, gpt2_torch.json.
set -uo pipefail
OUT=${1:?usage: bench/gpu/generated_products_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD..., gpu_tests_gated
gpu_setup "$OUT"
# the generated products' own test first, under a short limit: a failure there ends the call
gpu_tests_gated "$OUT/tests.log" 'CudaGpu.GeneratedProducts*' 150 || exit 0
gpt2_model
RUNS=/tmp/protean-gp-runs
mkdir -p "$RUNS"
for round in 1 2; do
  for on in 1 0; do
    step "gp${on}_$round" 60 env PROTEAN_CUDA_GENERATED_PRODUCTS=$on PROTEAN_CACHE_DIR=/tmp/pc-gp-$on PROTEAN_LOGS=cache \
      "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "gp${on}_$round" --steady --mode=reduce-overhead \
      > "$RUNS/gp${on}_$round.json" 2> "/tmp/gp${on}_$round.log"
    grep -h -E "generated products|W protean|error" "/tmp/gp${on}_$round.log" | head -5 >> "$log"
  done
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
  > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
