#!/usr/bin/env bash
# Where a replayed GPT-2 call's GPU time goes inside its CUDA graph, kernel by kernel:
# bench/gpu/graph_trace.sh OUTDIR [LENGTH...] (default 64 400), after a prebuilt tree from bench/gpu/pack.sh
# with libprotean_kernel_trace.so ($PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
# Per build (TRACE_BUILDS, default "ro mg": reduce-overhead, max-autotune, and m16, max-autotune over 16
# cuBLASLt algorithms; ri, reduce-overhead recording on the calling thread; rl, reduce-overhead
# uploading its graphs on the calls' stream; ru, reduce-overhead leaving the upload to the first
# launch; rw, reduce-overhead traced after 1 s of back-to-back calls (--profile-warm-ms 1000); their
# caches /tmp/pc-tab-<build>, shared with bench/gpu/tuning_ab.sh and bench/gpu/upload_ab.sh, so after
# them they start compiled and tuned) and length:
# protean_gpt2_bench --profile-call L --profile-repeat 5 under the CUPTI trace (bench/gpu/kernel_trace.cpp),
# OUTDIR/trace/<build>_L<length>.tsv, then bench/gpu/graph_trace.py into OUTDIR/graph_trace.json.
# TRACE_REPEAT=N traces N calls per process instead of 5; TRACE_PROCESSES=P runs P processes per build
# and length, one after another on the same cache, traced into <build>p<i>_L<length>.tsv: whether a
# build's steady call moves between processes, and which kernels move.
set -uo pipefail
OUT=${1:?usage: bench/gpu/graph_trace.sh OUTDIR [LENGTH...]}
shift
LENGTHS=${*:-64 400}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step
gpu_setup "$OUT"
gpt2_model
TRACE_LIB=$PREBUILT/lib/libprotean_kernel_trace.so
if [ ! -f "$TRACE_LIB" ]; then
  echo "graph_trace: no $TRACE_LIB (built only where CUPTI is installed)" >> "$log"
  exit 0
fi
mkdir -p "$OUT/trace"
REPEAT=${TRACE_REPEAT:-5}
PROCESSES=${TRACE_PROCESSES:-1}
for b in ${TRACE_BUILDS:-ro mg}; do
  extra=()
  warm=0
  case $b in
    ro) mode=reduce-overhead ;;
    mg) mode=max-autotune ;;
    m16) mode=max-autotune extra=(PROTEAN_AUTOTUNE_BLAS_ALGOS=16) ;;
    m0) mode=max-autotune extra=(PROTEAN_AUTOTUNE_BLAS_ONE_KERNEL=0) ;;
    r2) mode=reduce-overhead extra=(PROTEAN_CUDA_WARP_ROWS_PER_BLOCK=2) ;;
    ri) mode=reduce-overhead extra=(PROTEAN_CUDA_GRAPH_RECORD=inline) ;;
    rl) mode=reduce-overhead extra=(PROTEAN_CUDA_GRAPH_UPLOAD=launch) ;;
    ru) mode=reduce-overhead extra=(PROTEAN_CUDA_GRAPH_UPLOAD=off) ;;
    rw) mode=reduce-overhead warm=1000 ;;
    *) continue ;;
  esac
  for L in $LENGTHS; do
    for ((p = 1; p <= PROCESSES; ++p)); do
      label=$b
      [ "$PROCESSES" -gt 1 ] && label=${b}p$p
      echo "$REPEAT" > "$OUT/trace/${label}_L$L.calls"
      step "trace_${label}_$L" 120 env "${extra[@]}" PROTEAN_CACHE_DIR=/tmp/pc-tab-$b CUDA_INJECTION64_PATH="$TRACE_LIB" \
        PROTEAN_KERNEL_TRACE="$OUT/trace/${label}_L$L.tsv" "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "trace_$label" \
        --mode="$mode" --profile-call "$L" --profile-repeat "$REPEAT" --profile-warm-ms "$warm" > /dev/null 2> "/tmp/trace_${label}_$L.log"
      grep -h "kernel_trace\|gpt2_bench" "/tmp/trace_${label}_$L.log" | head -5 >> "$log"
    done
  done
done
python3 "$SRC/bench/gpu/graph_trace.py" "$OUT/graph_trace.json" "$OUT"/trace/*.tsv >> "$log" 2>&1
