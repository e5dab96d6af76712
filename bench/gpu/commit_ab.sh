#!/usr/bin/env bash
# GPT-2 small, this tree's build against an earlier commit's, in one device call:
# bench/gpu/commit_ab.sh OUTDIR [TRACE_LENGTH...] (default trace lengths 64 400 512)
# This tree: a prebuilt tree from bench/gpu/pack.sh ($PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz).
# The earlier commit: $PROTEAN_GPU_BASE (a folder with bin/protean_gpt2_bench and lib/libprotean.so.0),
# or .gpu/base.tgz unpacked; its libprotean goes ahead of the prebuilt tree's libraries.
# PROTEAN_GPU_BASE=self: the base is this tree's build run with $BASE_ENV (VAR=VALUE ..., e.g.
# PROTEAN_CUDA_FOLD_LAYER_NORM=0): an A/B of a switch in one build. BASE_ENV applies to any base.
# GATE_TIMEOUT: seconds for the gate alone (GATE_ONLY=1; default 120).
#   1. the gate ($GATE, default CudaGpu.IndexingKernelsMatchEager and CudaGpu.*Attention*), then CudaGpu* and
#      CudaGpuGraphs* (GATE_ONLY=1: the gate alone);
#   2. a fresh-cache run of each build (reduce-overhead ro / rob, max-autotune mg / mgb: b = the base),
#      each with a cache directory of its own;
#   3. ROUNDS rounds (default 2) from the caches, the order rotating by round
#      (BUILDS="ro rob mg mgb" by default picks the builds);
#   4. the CUPTI kernel trace (bench/gpu/kernel_trace.cpp) of mg and mgb (TRACE_BUILDS: any of ro rob mg
#      mgb) at the trace lengths, 5 replayed calls each, into OUTDIR/trace/graph_trace.json
#      (bench/gpu/graph_trace.py);
#   5. torch.compile reduce-overhead (SKIP_TORCH=1: not), then one more round.
# Every step writes under OUTDIR as it ends, so a call cut short still returns what finished.
# OUTDIR: steps.log, tests.log, runs/NAME.json, gpt2_runs.json, gpt2_torch.json, trace/
# (bench/gpu/tuning_merge.py OUTDIR RESULT.json COMMIT makes one results file of them).
set -uo pipefail
OUT=${1:?usage: bench/gpu/commit_ab.sh OUTDIR [TRACE_LENGTH...]}
shift
TRACE_LENGTHS=${*:-64 400 512}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step, gpt2_steady, gpu_tests_gated
gpu_setup "$OUT"
BASE=${PROTEAN_GPU_BASE:-}
read -r -a base_env <<< "${BASE_ENV:-}"
if [ "$BASE" = self ]; then
  BASE=$PREBUILT
  echo "base: this build with ${BASE_ENV:-no change}" >> "$log"
elif [ -z "$BASE" ]; then
  BASE=/tmp/protean-base
  mkdir -p "$BASE"
  tar xzf "$SRC/.gpu/base.tgz" -C "$BASE" || { echo "commit_ab: no base tree" >> "$log"; exit 0; }
fi
cat "$BASE/COMMIT" >> "$log" 2> /dev/null
if [ "${GATE_ONLY:-0}" = 1 ]; then  # the gate alone: a short call
  step tests "${GATE_TIMEOUT:-120}" "$BIN/protean_cuda_tests" --gtest_filter="${GATE:-CudaGpu.IndexingKernelsMatchEager:CudaGpu.*Attention*}" > /tmp/tests.log 2>&1
  grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which is|error" /tmp/tests.log | head -40 > "$OUT/tests.log"
  grep -q "^\[  FAILED" /tmp/tests.log && exit 0
else
  gpu_tests_gated "$OUT/tests.log" "${GATE:-CudaGpu.IndexingKernelsMatchEager:CudaGpu.*Attention*}" 200 || exit 0
fi
gpt2_model
RUNS=$OUT/runs
mkdir -p "$RUNS"
rm -rf /tmp/pc-ab-*
NEW_BIN=$BIN
run_build() {  # run_build BUILD NAME [ENV...]
  local b=$1 name=$2
  shift 2
  case $b in
    ro) gpt2_steady "$name" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-ab-ro "$@" ;;
    mg) gpt2_steady "$name" max-autotune 120 PROTEAN_CACHE_DIR=/tmp/pc-ab-mg "$@" ;;
    rob) BIN=$BASE/bin gpt2_steady "$name" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-ab-rob \
           LD_LIBRARY_PATH="$BASE/lib:$LD_LIBRARY_PATH" "${base_env[@]}" "$@" ;;
    mgb) BIN=$BASE/bin gpt2_steady "$name" max-autotune 120 PROTEAN_CACHE_DIR=/tmp/pc-ab-mgb \
           LD_LIBRARY_PATH="$BASE/lib:$LD_LIBRARY_PATH" "${base_env[@]}" "$@" ;;
  esac
}
read -r -a builds <<< "${BUILDS:-ro rob mg mgb}"
for b in "${builds[@]}"; do run_build "$b" "${b}_fresh"; done
round() {
  local r=$1 n=${#builds[@]} i
  for i in $(seq 0 $((n - 1))); do run_build "${builds[$(((i + r - 1) % n))]}" "${builds[$(((i + r - 1) % n))]}_$r"; done
}
for r in $(seq 1 "${ROUNDS:-2}"); do round "$r"; done
TRACE_LIB=$PREBUILT/lib/libprotean_kernel_trace.so
if [ -f "$TRACE_LIB" ]; then
  mkdir -p "$OUT/trace/trace"
  for b in ${TRACE_BUILDS:-mg mgb}; do
    bin=$NEW_BIN lib= extra=() mode=max-autotune
    case $b in rob|mgb) bin=$BASE/bin lib=$BASE/lib: extra=("${base_env[@]}") ;; esac
    case $b in ro|rob) mode=reduce-overhead ;; esac
    for L in $TRACE_LENGTHS; do
      echo 5 > "$OUT/trace/trace/${b}_L$L.calls"
      step "trace_${b}_$L" 120 env LD_LIBRARY_PATH="$lib$LD_LIBRARY_PATH" PROTEAN_CACHE_DIR=/tmp/pc-ab-$b "${extra[@]}" \
        CUDA_INJECTION64_PATH="$TRACE_LIB" PROTEAN_KERNEL_TRACE="$OUT/trace/trace/${b}_L$L.tsv" \
        "$bin/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "trace_$b" --mode=$mode --profile-call "$L" \
        --profile-repeat 5 > /dev/null 2> "/tmp/trace_${b}_$L.log"
    done
  done
  python3 "$SRC/bench/gpu/graph_trace.py" "$OUT/trace/graph_trace.json" "$OUT"/trace/trace/*.tsv >> "$log" 2>&1
fi
[ "${SKIP_TORCH:-0}" = 1 ] || step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
  > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
round $((${ROUNDS:-2} + 1))
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
