#!/usr/bin/env bash
# GPT-2 small under reduce-overhead against torch.compile reduce-overhead, on one GPU in one device
# call: bench/gpu/gpt2_same_run.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   protean_gpt2_bench --steady --mode=reduce-overhead: ro_0 into an empty cache, ro_1 and ro_2 warm,
#   then bench/gpu/gpt2_torch.py --reduce-overhead, then ro_3 warm (the lengths of scripts/export_gpt2.py).
# OUTDIR: steps.log, gpt2_runs.json (the four Protean processes), gpt2_torch.json.
set -uo pipefail
OUT=${1:?usage: bench/gpu/gpt2_same_run.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
gpt2_model
export PROTEAN_CACHE_DIR=/tmp/protean-same-run-cache
rm -rf "$PROTEAN_CACHE_DIR"
RUNS=/tmp/protean-same-run
mkdir -p "$RUNS"
for i in 0 1 2; do
  step "ro_$i" 90 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "ro_$i" --steady --mode=reduce-overhead \
    > "$RUNS/ro_$i.json" 2>> "$log"
done
step torch 200 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
  > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
step ro_3 90 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" ro_3 --steady --mode=reduce-overhead \
  > "$RUNS/ro_3.json" 2>> "$log"
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
