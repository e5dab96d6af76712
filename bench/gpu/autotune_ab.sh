#!/usr/bin/env bash
# GPT-2 small under max-autotune against reduce-overhead, both from warm caches, alternating, on one GPU
# in one device call: bench/gpu/autotune_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. a first run of each build with its own empty cache (the compiles, the cuBLASLt table and, for
#      max-autotune, every bucket tuned), PROTEAN_LOGS=graphs: what the tuning changed, per bucket.
#      Builds: ro (reduce-overhead), ma (max-autotune), mv (max-autotune with PROTEAN_AUTOTUNE_VARIANTS=0:
#      cuBLASLt algorithms and threads per row tuned, no row-kernel variants);
#   2. ROUNDS rounds (default 3), each running the three from their caches, the order rotating by
#      round, so drift over the call does not fall on one build.
# OUTDIR: steps.log, tuning.log (the max-autotune lines), runs.json (every run's protean_gpt2_bench JSON).
set -uo pipefail
OUT=${1:?usage: bench/gpu/autotune_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
gpt2_model
RUNS=/tmp/protean-autotune-runs
rm -rf "$RUNS" /tmp/pc-ab-ro /tmp/pc-ab-ma /tmp/pc-ab-mv
mkdir -p "$RUNS"
run_mode() {  # run_mode NAME MODE CACHE [ENV...]
  local name=$1 mode=$2 cache=$3
  shift 3
  step "$name" 90 env PROTEAN_CACHE_DIR="$cache" "$@" "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "$name" --steady \
    --mode="$mode" > "$RUNS/$name.json" 2> "$RUNS/$name.err"
}
run_build() {  # run_build BUILD NAME [ENV...]
  local b=$1 name=$2
  shift 2
  case $b in
    ro) run_mode "$name" reduce-overhead /tmp/pc-ab-ro "$@" ;;
    ma) run_mode "$name" max-autotune /tmp/pc-ab-ma "$@" ;;
    mv) run_mode "$name" max-autotune /tmp/pc-ab-mv PROTEAN_AUTOTUNE_VARIANTS=0 "$@" ;;
  esac
}
for b in ro ma mv; do run_build $b "${b}_fresh" PROTEAN_LOGS=graphs; done
{ echo "== ma"; grep -h "max-autotune" "$RUNS/ma_fresh.err"; echo "== mv"; grep -h "max-autotune" "$RUNS/mv_fresh.err"; } > "$OUT/tuning.log" 2>/dev/null
for round in $(seq 1 "${ROUNDS:-3}"); do
  case $((round % 3)) in 1) order="ro ma mv" ;; 2) order="ma mv ro" ;; 0) order="mv ro ma" ;; esac
  for b in $order; do run_build $b "${b}_warm_$round"; done
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/runs.json" --summary
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
