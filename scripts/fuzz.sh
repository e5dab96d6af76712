#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang) against build/ and runs each one over its seed
# corpus, then prints executions and crashes per target.
#
#   scripts/fuzz.sh                 short run (CI): each target for PROTEAN_FUZZ_RUNS (default 2000)
#                                   executions from a fixed seed, so a run repeats exactly on a fresh
#                                   checkout (a time limit would explore more or less with the machine's speed)
#   scripts/fuzz.sh --runs 1000000  long run: each target for 1,000,000 executions
#   scripts/fuzz.sh --seconds 600   long run: each target for 10 minutes
#   scripts/fuzz.sh --only npy ...  the named targets only
#   PROTEAN_FUZZ_TIMEOUT_S=60       seconds one input may take before it counts as a hang (default 10; raise
#                                   it on a loaded machine, where a starved process can pass 10 s on any input)
#
# Corpora live in build-fuzz/corpus/<target> (kept between runs, so long runs accumulate): the seeds
# of tests/fuzz/seeds/<target>, plus the real models (~/.cache/protean/models, scripts/fetch_models.sh)
# and ONNX's node test models (libonnx-testdata) for the ONNX loader. A crash leaves its input in
# build-fuzz/crashes/<target>/ and makes the script exit 1: add it to tests/fuzz/seeds/<target>/ with
# the fix, so FuzzReplay.<target> keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=0
runs=${PROTEAN_FUZZ_RUNS:-2000}
seed=1  # the short run's fixed seed; the long runs (--runs, --seconds) draw their own
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; runs=-1; seed=0; shift 2 ;;
    --runs) runs=$2; seconds=0; seed=0; shift 2 ;;
    --only) shift; while [ $# -gt 0 ] && [[ $1 != --* ]]; do only+=("$1"); shift; done ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
targets=(npy pgo_profile trace_reader cache_meta cache_bundle onnx_loader)
[ ${#only[@]} -gt 0 ] && targets=("${only[@]}")

[ -f build/libprotean.so ] || { echo "fuzz.sh: build the project first (scripts/build.sh)" >&2; exit 2; }
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is missing (scripts/setup.sh installs it)" >&2; exit 2; }
mkdir -p build-fuzz
if [ ! -f build-fuzz/build.ninja ]; then
  cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPROTEAN_BUILD_DIR="$root/build" >build-fuzz/configure.log 2>&1 || { cat build-fuzz/configure.log; exit 1; }
fi
cmake --build build-fuzz -j "${PROTEAN_BUILD_JOBS:-$(nproc)}" >build-fuzz/build.log 2>&1 || { tail -40 build-fuzz/build.log; exit 1; }

models=${PROTEAN_MODELS_DIR:-$HOME/.cache/protean/models}
status=0
printf '%-14s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$t crashes=build-fuzz/crashes/$t
  mkdir -p "$corpus" "$crashes"
  cp -n tests/fuzz/seeds/$t/* "$corpus"/ 2>/dev/null || true
  max_len=65536
  if [ "$t" = onnx_loader ]; then
    for m in "$models"/*.onnx; do [ -f "$m" ] && cp -n "$m" "$corpus"/ ; done
    if [ -d /usr/include/onnx/backend/test/data/node ]; then
      for m in /usr/include/onnx/backend/test/data/node/*/model.onnx; do
        cp -n "$m" "$corpus/node_$(basename "$(dirname "$m")").onnx"
      done
    fi
    max_len=4096  # the real models' first 4 KiB (header, opsets, first nodes) and whole node models
  fi
  log=build-fuzz/$t.log
  args=(-max_len=$max_len -timeout=${PROTEAN_FUZZ_TIMEOUT_S:-10} -rss_limit_mb=2048 -artifact_prefix="$crashes/" -print_final_stats=1)
  if [ "$runs" -ge 0 ]; then args+=(-runs="$runs"); else args+=(-max_total_time="$seconds"); fi
  if [ "$seed" -ne 0 ]; then args+=(-seed="$seed"); fi
  rc=0
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build-fuzz/${t}_fuzz" "${args[@]}" "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo 0)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo 0)
  found=$(find "$crashes" -type f | wc -l)
  printf '%-14s %12s %10s %8s\n' "$t" "${execs:-0}" "${rate:-0}" "$found"
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    status=1
    echo "  $t: exit $rc; see $log" >&2
    grep -m5 -E 'ERROR|SUMMARY|escaped' "$log" >&2 || true
  fi
done
exit $status
