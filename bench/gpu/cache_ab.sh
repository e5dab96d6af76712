#!/usr/bin/env bash
# GPT-2 small under reduce-overhead: a process that compiles everything (empty cache) against one that
# loads everything from a warm cache, and against warm caches missing one part (the cuBLASLt algorithm
# table, or everything but it), interleaved so drift over the call does not fall on one kind of run:
# bench/gpu/cache_ab.sh OUTDIR (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or
# .gpu/prebuilt.tgz of the source tree).
#   fresh_X:    an empty cache (compiles, cuBLASLt heuristic; fills cache X)
#   warm_N:     the cache of fresh_A
#   noblas_N:   a copy of it without the cuBLASLt algorithm table (heuristic answers again)
#   blasonly_N: an otherwise empty cache holding only that table (everything compiled again)
# CACHE_AB=table instead runs, from cache A: warm_N, noprewarm_N (PROTEAN_CUDA_BLAS_PREWARM=0: the table's
# algorithms are not run once at start) and check_N (PROTEAN_CUDA_BLAS_TABLE_CHECK=1: the heuristic
# answers again for every table entry and its answer is used where it differs; the differences logged).
# CACHE_AB=prewarm instead runs, from cache A, two rounds of: on (the default warm-up, its products on
# the device's stream), off (PROTEAN_CUDA_BLAS_PREWARM=0), plan (=plan: the warm-up makes the plans but
# runs no product), own (=own_stream: its products on a stream of its own), and default_on / default_off
# (mode default, plain launches, warm-up on and off).
# CACHE_AB=stream: three rounds, the order rotating, of on, own and off.
# OUTDIR: steps.log, runs.json (every run's protean_gpt2_bench JSON), a summary on stdout.
set -uo pipefail
OUT=${1:?usage: bench/gpu/cache_ab.sh OUTDIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
gpt2_model
RUNS=/tmp/protean-cache-runs
C=/tmp/pc-cache-ab
rm -rf "$RUNS" "$C"
mkdir -p "$RUNS" "$C"
run_ro() {  # run_ro NAME CACHE [ENV...] (MODE: reduce-overhead unless set)
  local name=$1 cache=$2
  shift 2
  step "$name" 90 env PROTEAN_CACHE_DIR="$cache" "$@" "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "$name" --steady \
    --mode="${MODE:-reduce-overhead}" > "$RUNS/$name.json" 2> "$RUNS/$name.err"
}
noblas() {  # a copy of cache A without the cuBLASLt table
  rm -rf "$C/nb" && cp -r "$C/A" "$C/nb" && rm -rf "$C/nb/cublaslt"
  echo "$C/nb"
}
blasonly() {  # an empty cache but for cache A's cuBLASLt table
  rm -rf "$C/bo" && mkdir -p "$C/bo" && cp -r "$C/A/cublaslt" "$C/bo/"
  echo "$C/bo"
}
run_ro fresh_A "$C/A"
ls -R "$C/A" | head -20 >> "$log"
if [ "${CACHE_AB:-}" = stream ]; then  # the warm-up's stream: the device's (default), its own; and off
  for round in 1 2 3; do
    case $round in 1) order="on own off" ;; 2) order="own off on" ;; 3) order="off on own" ;; esac
    for v in $order; do
      case $v in
        on) run_ro "on_$round" "$C/A" ;;
        own) run_ro "own_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=own_stream ;;
        off) run_ro "off_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=0 ;;
      esac
    done
  done
elif [ "${CACHE_AB:-}" = prewarm ]; then
  for round in 1 2; do
    run_ro "on_$round" "$C/A"
    run_ro "off_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=0
    run_ro "plan_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=plan
    run_ro "own_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=own_stream
    MODE=default run_ro "default_on_$round" "$C/A"
    MODE=default run_ro "default_off_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=0
  done
elif [ "${CACHE_AB:-}" = table ]; then
  for round in 1 2 3; do
    case $round in 1) order="warm noprewarm check" ;; 2) order="check warm noprewarm" ;; 3) order="noprewarm check warm" ;; esac
    for v in $order; do
      case $v in
        warm) run_ro "warm_$round" "$C/A" ;;
        noprewarm) run_ro "noprewarm_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=0 ;;
        check) run_ro "check_$round" "$C/A" PROTEAN_CUDA_BLAS_TABLE_CHECK=1 PROTEAN_LOGS=cache ;;
      esac
    done
  done
  grep -h "algorithm table" "$RUNS"/check_1.err | head -60 > "$OUT/table_check.log"
else
run_ro warm_1 "$C/A"
run_ro fresh_B "$C/B"
run_ro noblas_1 "$(noblas)"
run_ro blasonly_1 "$(blasonly)"
run_ro warm_2 "$C/A"
run_ro noblas_2 "$(noblas)"
run_ro fresh_C "$C/C"
run_ro blasonly_2 "$(blasonly)"
run_ro warm_3 "$C/A"
fi
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/runs.json" --summary
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
