#!/usr/bin/env bash
# Where reduce-overhead's graphs are recorded and uploaded, and the idle time between the kernels of a
# replayed GPT-2 call: bench/gpu/upload_ab.sh OUTDIR (run from the repository root; the prebuilt tree of
# bench/gpu/pack.sh in .gpu/prebuilt.tgz, as bench/gpu/commit_ab.sh).
# Builds (environment only, one binary): ro, reduce-overhead as it is (recorded on the compile worker,
# uploaded on the worker's stream); ri, recorded on the calling thread (PROTEAN_CUDA_GRAPH_RECORD=inline);
# rl, recorded on the worker and uploaded on the calls' stream (PROTEAN_CUDA_GRAPH_UPLOAD=launch); ru,
# recorded on the worker and uploaded by its first launch (PROTEAN_CUDA_GRAPH_UPLOAD=off); mg, max-autotune
# (recorded on the calling thread after its tuning). BUILDS picks some (default "ro ri rl ru mg").
# Steps: the gate tests; GPU clocks logged once a second through the call (OUTDIR/dmon.log); per build
# (and rw: reduce-overhead after 1 s of back-to-back calls, traced only), TRACE_PROCESSES (3) processes tracing 10 replayed calls at 400 and 200 tokens (bench/gpu/graph_trace.sh,
# OUTDIR/trace/graph_trace.json: span and idle time per process); ROUNDS (3) rotating rounds of the 12
# lengths with --steady per build (OUTDIR/gpt2_runs.json); torch.compile reduce-overhead in the same call
# (OUTDIR/gpt2_torch.json); then CudaGpu* / CudaGpuGraphs*.
set -uo pipefail
OUT=${1:?usage: bench/gpu/upload_ab.sh OUTDIR}
SRC=$(pwd)
. "$SRC/bench/gpu/common.sh"
gpu_setup "$OUT"
timeout 60 "$BIN/protean_cuda_tests" --gtest_filter="CudaGpu.IndexingKernelsMatchEager:CudaGpu.*Attention*" > "$OUT/gate.log" 2>&1 ||
  { echo "gate tests failed" >> "$log"; exit 0; }
gpt2_model
rm -rf /tmp/pc-*
nvidia-smi dmon -s pc -d 1 > "$OUT/dmon.log" 2>&1 &
DMON=$!
BUILDS=${BUILDS:-ro ri rl ru mg}
TRACE_BUILDS="${TRACE_BUILDS:-$BUILDS rw}" TRACE_PROCESSES=${TRACE_PROCESSES:-3} TRACE_REPEAT=10 bash "$SRC/bench/gpu/graph_trace.sh" "$OUT/trace" 400 200
cat "$OUT/trace/steps.log" >> "$log"
RUNS=$OUT/runs
mkdir -p "$RUNS"
B=($BUILDS)
n=${#B[@]}
for ((r = 1; r <= ${ROUNDS:-3}; ++r)); do
  for ((i = 0; i < n; ++i)); do
    b=${B[$(((i + r) % n))]}
    case $b in
      ro) gpt2_steady ro_$r reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-ro ;;
      ri) gpt2_steady ri_$r reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-ri PROTEAN_CUDA_GRAPH_RECORD=inline ;;
      rl) gpt2_steady rl_$r reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-rl PROTEAN_CUDA_GRAPH_UPLOAD=launch ;;
      ru) gpt2_steady ru_$r reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-tab-ru PROTEAN_CUDA_GRAPH_UPLOAD=off ;;
      mg) gpt2_steady mg_$r max-autotune 120 PROTEAN_CACHE_DIR=/tmp/pc-tab-mg ;;
    esac
    echo "$b round $r: $(date +%T)" >> "$log"
  done
done
step torch 120 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
kill $DMON 2>/dev/null
step tests 200 "$BIN/protean_cuda_tests" --gtest_filter='CudaGpu*:CudaGpuGraphs*' > /tmp/tests.log 2>&1
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which is|error" /tmp/tests.log | head -60 > "$OUT/tests.log"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
