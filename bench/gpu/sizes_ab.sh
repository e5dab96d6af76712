#!/usr/bin/env bash
# Sizes in memory against sizes by value, on one GPU, in one device call: bench/gpu/sizes_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or DIR/prebuilt.tgz beside it).
#   1. the cuda tests on the device: fake-driver CudaGraphs.*, real-device CudaGpuGraphs.* and CudaGpu.*;
#   2. GPT-2 small exported (scripts/export_gpt2.py), then protean_gpt2_bench --mode=reduce-overhead
#      --steady in two rounds, each round four builds of the graphs, each adding one change:
#        by_value:  PROTEAN_CUDA_SIZES_IN_MEMORY=0
#        in_memory: the default
#        staged:    PROTEAN_CUDA_GRAPH_STAGE_INPUTS=1
#        flat:      PROTEAN_CUDA_GRAPH_STAGE_INPUTS=1 PROTEAN_CUDA_GRAPH_FLAT_LIBRARY=1
#      (steady latency of the 12 lengths, same input and a new input tensor per call, and the first
#      call of 4 new lengths inside recorded buckets), merged into OUTDIR/gpt2_runs.json; then
#      torch.compile reduce-overhead (bench/gpu/gpt2_torch.py) in the same call;
#   3. compute-sanitizer memcheck of CudaGpuGraphs.* with the time left.
# Each step writes its own file in OUTDIR (at most 8 come back); steps.log has each step's status.
set -uo pipefail
OUT=${1:?usage: bench/gpu/sizes_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
step tests 150 "$BIN/protean_cuda_tests" --gtest_filter='CudaGraphs*:CudaGpuGraphs*:CudaGpu.*' > /tmp/tests.log 2>&1
grep -E "FAILED|PASSED|SKIPPED|Failure" /tmp/tests.log | head -20 >> "$log"
gpt2_model
RUNS=/tmp/protean-gpt2-runs
mkdir -p "$RUNS"
for round in 1 2; do
  step "by_value_$round" 60 env PROTEAN_CUDA_SIZES_IN_MEMORY=0 \
    "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" by_value --steady --mode=reduce-overhead > "$RUNS/by_value_$round.json" 2>> "$log"
  step "in_memory_$round" 60 "$BIN/protean_gpt2_bench" \
    "$WORK/gpt2.onnx" "$WORK" in_memory --steady --mode=reduce-overhead > "$RUNS/in_memory_$round.json" 2>> "$log"
  step "staged_$round" 60 env PROTEAN_CUDA_GRAPH_STAGE_INPUTS=1 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" staged \
    --steady --mode=reduce-overhead > "$RUNS/staged_$round.json" 2>> "$log"
  step "flat_$round" 60 env PROTEAN_CUDA_GRAPH_STAGE_INPUTS=1 PROTEAN_CUDA_GRAPH_FLAT_LIBRARY=1 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" flat \
    --steady --mode=reduce-overhead \
    > "$RUNS/flat_$round.json" 2>> "$log"
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json"
if [ "${SIZES_AB_SKIP_TORCH:-0}" != 1 ]; then  # SIZES_AB_SKIP_TORCH=1: Protean's builds only (a short call)
  step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
    > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
  tail -c 1500 /tmp/gpt2_torch.log >> "$log"
fi
left=$((560 - SECONDS)); [ "$left" -lt 10 ] && left=10
step memcheck "$left" compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$BIN/protean_cuda_tests" --gtest_filter='CudaGpuGraphs.*' > /tmp/memcheck.log 2>&1
tail -5 /tmp/memcheck.log >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
tail -3 /tmp/tests.log
