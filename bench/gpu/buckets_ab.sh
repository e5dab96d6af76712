#!/usr/bin/env bash
# What a bucket's padding costs GPT-2 under reduce-overhead, in one device call:
#   bench/gpu/buckets_ab.sh OUTDIR [SPEC...]
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz.)
# GPT-2 small exported once (scripts/export_gpt2.py), then protean_gpt2_bench --steady
# --mode=reduce-overhead once per bucket policy (PROTEAN_BUCKETS = each SPEC; default: the default
# policy, step=32, step=16 and exact), in two rounds alternating the policies; torch.compile
# reduce-overhead (bench/gpu/gpt2_torch.py) after the first round. The cuBLASLt products of a bucket's
# graph run at the bucket's upper bound (docs/graphs.md), so the steady latency of a length inside a
# wide bucket against the same length in a bucket of its own is what the padding costs there.
# Writes OUTDIR/gpt2_runs.json (run NAME = policy_round), OUTDIR/gpt2_torch.json, OUTDIR/steps.log.
set -uo pipefail
OUT=${1:?usage: bench/gpu/buckets_ab.sh OUTDIR [SPEC...]}
shift
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=(default step=32 step=16 exact)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
gpt2_model
RUNS=/tmp/protean-gpt2-buckets
mkdir -p "$RUNS"
for round in 1 2; do
  for s in "${specs[@]}"; do
    name=$(echo "$s" | tr -c 'a-zA-Z0-9\n' '_')_$round
    step "$name" 90 env PROTEAN_BUCKETS="$s" "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "$s" \
      --steady --mode=reduce-overhead > "$RUNS/$name.json" 2>> "$log"
  done
  if [ "$round" = 1 ] && [ "${BUCKETS_AB_SKIP_TORCH:-0}" != 1 ]; then
    step torch 120 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
      > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
    tail -c 600 /tmp/gpt2_torch.log >> "$log"
  fi
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary | tee -a "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
