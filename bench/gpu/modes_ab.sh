#!/usr/bin/env bash
# GPT-2 small at its 12 lengths under reduce-overhead (64-wide buckets above 64), reduce-overhead with
# PROTEAN_BUCKETS=exact (a graph per length, the cuBLASLt products at the exact row count) and
# max-autotune (cuBLASLt's algorithms timed per bucket), ROUNDS (default 2) rounds alternating, on one
# GPU in one device call: bench/gpu/modes_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
# OUTDIR: steps.log, gpt2_runs.json.
set -uo pipefail
OUT=${1:?usage: bench/gpu/modes_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
gpt2_model
RUNS=/tmp/protean-modes-runs
mkdir -p "$RUNS"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in reduce exact autotune; do
    mode=reduce-overhead buckets=default
    [ "$v" = exact ] && buckets=exact
    [ "$v" = autotune ] && mode=max-autotune
    step "${v}_$round" 60 env PROTEAN_BUCKETS=$buckets "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "${v}_$round" \
      --steady --mode=$mode > "$RUNS/${v}_$round.json" 2> "/tmp/${v}_$round.log"
  done
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
