#!/usr/bin/env bash
# GPT-2 small under reduce-overhead and max-autotune, and where a new length's first call spends its
# extra GPU time, in one device call: bench/gpu/first_call_ab.sh OUTDIR (run from the repository root;
# the prebuilt tree of bench/gpu/pack.sh in .gpu/prebuilt.tgz, as bench/gpu/commit_ab.sh).
# Steps: the gate and CudaGpu* / CudaGpuGraphs*; a fresh-cache run of ro (reduce-overhead) and mg
# (max-autotune) and two rotating rounds (OUTDIR/gpt2_runs.json); for each mode the CUPTI trace of a
# new length inside a recorded bucket (470 tokens: its first call and 5 steady calls, one profiler
# window each, copies included; OUTDIR/first_call_trace.json from bench/gpu/first_call_trace.py);
# torch.compile reduce-overhead (OUTDIR/gpt2_torch.json); one more round.
set -uo pipefail
OUT=${1:?}
SRC=$(pwd)
. "$SRC/bench/gpu/common.sh"
gpt2_ab_begin "$OUT"
run() { gpt2_mode_run "$@"; }  # run BUILD NAME
B=(ro mg)
for b in ro mg; do run $b ${b}_fresh; done
for r in 1 2; do
  for i in 0 1; do b=${B[$(((i + r) % 2))]}; run $b ${b}_$r; done
done
TRACE_LIB=$PREBUILT/lib/libprotean_kernel_trace.so
if [ -f "$TRACE_LIB" ]; then
  mkdir -p "$OUT/trace"
  for b in ro mg; do
    step "trace_new_$b" 150 env PROTEAN_CACHE_DIR=/tmp/pc-$b CUDA_INJECTION64_PATH="$TRACE_LIB" PROTEAN_KERNEL_TRACE_MEMCPY=1 \
      PROTEAN_KERNEL_TRACE="$OUT/trace/${b}_new470.tsv" \
      "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "trace_new_$b" \
      --mode=$([ $b = ro ] && echo reduce-overhead || echo max-autotune) --profile-new-length 470 --profile-repeat 5 \
      > /dev/null 2> "/tmp/trace_new_$b.log"
    grep -E "gpt2_bench|kernel_trace" "/tmp/trace_new_$b.log" | head -5 >> "$log"
  done
  python3 "$SRC/bench/gpu/first_call_trace.py" "$OUT/first_call_trace.json" "$OUT"/trace/*.tsv >> "$log" 2>&1
  gzip -f "$OUT"/trace/*.tsv
fi
step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
for i in 0 1; do b=${B[$i]}; run $b ${b}_3; done
python3 "$SRC/bench/gpu/collect_runs.py" "$RUNS" "$OUT/gpt2_runs.json" --summary >> "$log"
rm -rf "$RUNS"
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
