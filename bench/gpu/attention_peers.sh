#!/usr/bin/env bash
# The fused causal attention kernel alone against each of torch's SDPA backends, on one GPU in one
# device call: bench/gpu/attention_peers.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
# Two rounds of: protean_cuda_bench --attention, then bench/gpu/torch_attention.py flash cudnn efficient default.
# OUTDIR: steps.log, protean_attention_R.json, torch_attention_R.json.
set -uo pipefail
OUT=${1:?usage: bench/gpu/attention_peers.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
for round in 1 2; do
  step "protean_$round" 90 env PROTEAN_CACHE_DIR=/tmp/pc-attn "$BIN/protean_cuda_bench" --attention \
    > "$OUT/protean_attention_$round.json" 2>> /tmp/attention.log
  step "torch_$round" 120 python3 "$SRC/bench/gpu/torch_attention.py" flash cudnn efficient default \
    > "$OUT/torch_attention_$round.json" 2>> /tmp/attention.log
done
tail -5 /tmp/attention.log >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
