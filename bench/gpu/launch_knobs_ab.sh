#!/usr/bin/env bash
# GPT-2 small under reduce-overhead with two launch knobs against the defaults, in one device call:
# bench/gpu/launch_knobs_ab.sh OUTDIR (run from the repository root; the prebuilt tree of
# bench/gpu/pack.sh in .gpu/prebuilt.tgz, as bench/gpu/commit_ab.sh).
# Builds: ro (reduce-overhead, defaults), r0 (PROTEAN_CUDA_WARP_FILL_BLOCKS=0: warp-per-row kernels keep
# 4 rows a block at every size), mg (max-autotune). (The run of 2026-12-07 at fc53cfa also had rs, a
# switch for stream size writes since removed; docs/graphs.md.) Steps: the
# gate and CudaGpu* / CudaGpuGraphs*, a fresh-cache run of ro r0 mg, two rotating rounds, one run of
# ro and mg with PROTEAN_LOGS=graphs (their bucket and new-size lines into OUTDIR/graphs_log_*.txt), the
# CUPTI trace of ro and r0 at 400 tokens (OUTDIR/trace/graph_trace.json), torch.compile
# reduce-overhead, one more round; OUTDIR/gpt2_runs.json collects the runs.
set -uo pipefail
OUT=${1:?}
SRC=$(pwd)
. "$SRC/bench/gpu/common.sh"
gpt2_ab_begin "$OUT"
run() {  # run BUILD NAME
  case $1 in
    r0) gpt2_steady "$2" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-r0 PROTEAN_CUDA_WARP_FILL_BLOCKS=0 ;;
    *) gpt2_mode_run "$@" ;;
  esac
}
B=(ro r0 mg)
for b in ro r0 mg; do run $b ${b}_fresh; done
for r in 1 2; do
  for i in 0 1 2; do b=${B[$(((i + r) % 3))]}; run $b ${b}_$r; done
done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs_partial.json" --summary >> "$log"
for b in ro mg; do
  step logs_$b 60 env PROTEAN_LOGS=graphs PROTEAN_CACHE_DIR=/tmp/pc-$b "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" logs_$b --steady \
    --mode=$([ $b = ro ] && echo reduce-overhead || echo max-autotune) > "$RUNS/logs_$b.json" 2> /tmp/logs_$b.log
  grep -E "new sizes|recorded|bucket" /tmp/logs_$b.log | head -60 > "$OUT/graphs_log_$b.txt"
done
TRACE_LIB=$PREBUILT/lib/libprotean_kernel_trace.so
if [ -f "$TRACE_LIB" ]; then
  mkdir -p "$OUT/trace/trace"
  for b in ro r0; do
    echo 5 > "$OUT/trace/trace/${b}_L400.calls"
    step "trace_$b" 120 env PROTEAN_CACHE_DIR=/tmp/pc-$b $([ $b = r0 ] && echo PROTEAN_CUDA_WARP_FILL_BLOCKS=0) \
      CUDA_INJECTION64_PATH="$TRACE_LIB" PROTEAN_KERNEL_TRACE="$OUT/trace/trace/${b}_L400.tsv" \
      "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "trace_$b" --mode=reduce-overhead --profile-call 400 \
      --profile-repeat 5 > /dev/null 2> "/tmp/trace_$b.log"
  done
  python3 "$SRC/bench/gpu/graph_trace.py" "$OUT/trace/graph_trace.json" "$OUT"/trace/trace/*.tsv >> "$log" 2>&1
  rm -rf "$OUT/trace/trace"
fi
step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
for i in 0 1 2; do b=${B[$i]}; run $b ${b}_3; done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
rm -rf "$RUNS" "$OUT/gpt2_runs_partial.json"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
