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
# CACHE_AB=prewarm instead runs, from cache A, two rounds of: on (the default warm-up), off
# (PROTEAN_CUDA_BLAS_PREWARM=0), plan (=plan: the warm-up makes the plans but runs no product), devstream (=device_stream: its products on
# the device's stream), and
# default_on / default_off (mode default, plain launches, warm-up on and off).
# CACHE_AB=stream: two rounds of on, off and devstream.
# OUTDIR: steps.log, runs.json (every run's protean_gpt2_bench JSON), a summary on stdout.
set -uo pipefail
OUT=${1:?usage: bench/gpu/cache_ab.sh OUTDIR}
mkdir -p "$OUT"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # use_prebuilt, cuda_library_path, step NAME TIMEOUT_S CMD...
use_prebuilt || exit 1
cuda_library_path
export PROTEAN_SOURCE_DIR=$SRC
log=$OUT/steps.log
{ echo "commit $(cat "$SRC/.gpu/COMMIT" 2>/dev/null || echo unknown)"; nvidia-smi -L; uptime; } > "$log" 2>&1
status=()
WORK=/tmp/protean-gpt2
mkdir -p "$WORK"
[ -f "$WORK/gpt2.onnx" ] || step export 90 python3 "$SRC/scripts/export_gpt2.py" "$WORK" > /tmp/gpt2_export.json 2>> "$log"
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
if [ "${CACHE_AB:-}" = stream ]; then  # the warm-up's stream: its own (default) or the device's; and off
  for round in 1 2; do
    run_ro "on_$round" "$C/A"
    run_ro "off_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=0
    run_ro "devstream_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=device_stream
  done
elif [ "${CACHE_AB:-}" = prewarm ]; then
  for round in 1 2; do
    run_ro "on_$round" "$C/A"
    run_ro "off_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=0
    run_ro "plan_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=plan
    run_ro "devstream_$round" "$C/A" PROTEAN_CUDA_BLAS_PREWARM=device_stream
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
RUNS=$RUNS python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.environ["RUNS"] + "/*.json"), key=os.path.getmtime):
    name = os.path.basename(f)[:-5]
    text = open(f).read()
    try:
        d = json.loads(text)
    except Exception:
        lines = [l for l in text.splitlines() if l.startswith("{")]
        try:
            d = json.loads(lines[-1])
        except Exception as e:
            d = {"error": repr(e), "text": text[-1500:]}
    runs[name] = d
json.dump(runs, open(os.path.join(out, "runs.json"), "w"))
for name, d in runs.items():
    steady = {str(r["seq"]): r["steady_ms"]["median"] for r in d.get("lengths", []) if "steady_ms" in r}
    print(name, json.dumps(steady), "cublaslt", json.dumps(d.get("cublaslt")), "compiles", d.get("compiles_total"))
PY
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
