#!/usr/bin/env bash
# The attention's lazy rescale against rescaling at every key tile, and max-autotune's tuning on the
# calling thread, on one GPU in one device call: bench/gpu/rescale_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. the cuda tests on the device (CudaGpu*, CudaGraphs*, CudaGpuGraphs*), with the lazy rescale;
#   2. two rounds, each alternating PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1 and =0:
#      the attention kernel alone (protean_cuda_bench --attention) and GPT-2 small under reduce-overhead
#      (protean_gpt2_bench --steady, lengths of scripts/export_gpt2.py);
#   3. GPT-2 small under max-autotune (a fresh cache: every bucket tuned in this run);
#   4. torch.compile reduce-overhead on the same model (bench/gpu/gpt2_torch.py).
# OUTDIR: steps.log, attention.json, gpt2_runs.json, gpt2_torch.json, tests.log.
# RESCALE_AB_SHORT=1: one round, no tests and no torch (a short call).
set -uo pipefail
OUT=${1:?usage: bench/gpu/rescale_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
SHORT=${RESCALE_AB_SHORT:-0}
if [ "$SHORT" = 1 ]; then  # the attention's GPU test with the lazy rescale only
  step tests 60 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1 "$BIN/protean_cuda_tests" --gtest_filter='CudaGpu.FusedAttention*' > /tmp/tests.log 2>&1
else
  step tests 150 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1 "$BIN/protean_cuda_tests" --gtest_filter='CudaGpu*:CudaGraphs*:CudaGpuGraphs*' > /tmp/tests.log 2>&1
fi
grep -E "FAILED|PASSED|SKIPPED|Failure" /tmp/tests.log | head -20 > "$OUT/tests.log"
gpt2_model
RUNS=/tmp/protean-rescale-runs
mkdir -p "$RUNS"
rounds="1 2"; [ "$SHORT" = 1 ] && rounds=1
for round in $rounds; do
  for lazy in 1 0; do
    step "attention_lazy${lazy}_$round" 60 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=$lazy PROTEAN_CACHE_DIR=/tmp/pc-attn-$lazy \
      "$BIN/protean_cuda_bench" --attention > "$RUNS/attention_lazy${lazy}_$round.json" 2>> /tmp/attention.log
    step "ro_lazy${lazy}_$round" 60 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=$lazy PROTEAN_CACHE_DIR=/tmp/pc-ro-$lazy \
      "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "ro_lazy$lazy" --steady --mode=reduce-overhead \
      > "$RUNS/ro_lazy${lazy}_$round.json" 2>> "$log"
  done
done
step max_autotune 120 env PROTEAN_CACHE_DIR=/tmp/pc-ma-fresh "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" max_autotune \
  --steady --mode=max-autotune > "$RUNS/max_autotune.json" 2>> "$log"
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --split attention "$OUT/attention.json"
[ "$SHORT" = 1 ] || step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
  > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
tail -3 /tmp/tests.log
