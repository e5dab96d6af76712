#!/usr/bin/env bash
# The GPU work of [graphs] in one call: bench/gpu/graphs.sh OUTDIR (a prebuilt tree from
# bench/gpu/pack.sh, found as bench/gpu/run.sh finds it).
#   1. the graph tests: fake-driver CudaGraphs.* and the real-device CudaGpuGraphs.*;
#   2. compute-sanitizer memcheck of CudaGpuGraphs.*;
#   3. protean_cuda_bench --graphs and torch_graphs_bench.py in the same run, merged into
#      OUTDIR/graphs_bench.json with the device, the commit and the load.
# With PROTEAN_GPU_GPT2_GRAPHS=1 (one short device call: GPT-2 first, the small-function torch side
# left out), instead: the graph tests; GPT-2 small exported (scripts/export_gpt2.py) and run by
# protean_gpt2_bench --mode=reduce-overhead and default mode and by gpt2_torch.py --reduce-overhead;
# protean_cuda_bench --graphs; memcheck. Each step writes its own file in OUTDIR (a step cut short
# leaves the others), merged afterwards into one JSON under bench/results.
set -uo pipefail
OUT=${1:?usage: bench/gpu/graphs.sh OUTDIR}
mkdir -p "$OUT"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PREBUILT=${PROTEAN_GPU_PREBUILT:-$SRC/../prebuilt}
if [ ! -d "$PREBUILT" ] && ls "$SRC"/../*.tgz > /dev/null 2>&1; then  # as run.sh: gzipped bin/ and lib/
  mkdir -p /tmp/protean-prebuilt
  for t in "$SRC"/../*.tgz; do tar xzf "$t" -C /tmp/protean-prebuilt; done
  PREBUILT=/tmp/protean-prebuilt
fi
BIN=$PREBUILT/bin
export LD_LIBRARY_PATH=$PREBUILT/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
. "$SRC/bench/gpu/common.sh"  # cuda_library_path, step NAME TIMEOUT_S CMD...
cuda_library_path
COMMIT=$(cat "$SRC/COMMIT" 2>/dev/null || echo unknown)
status=()
{ echo "commit $COMMIT"; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; uptime;
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } > "$OUT/env.txt" 2>&1
export PROTEAN_SOURCE_DIR=$SRC  # tests/data for the fake-driver tiny GPT-2 test
if [ "${PROTEAN_GPU_GPT2_GRAPHS:-0}" = 1 ]; then
  WORK=/tmp/protean-gpt2
  mkdir -p "$WORK"
  log=$OUT/steps.log
  mv "$OUT/env.txt" "$log"  # at most 8 files come back from a device call
  step tests 30 "$BIN/protean_cuda_tests" --gtest_filter='CudaGraphs*:CudaGpuGraphs*' > "$OUT/tests.log" 2>&1
  step export 60 python3 "$SRC/scripts/export_gpt2.py" "$WORK" > /tmp/gpt2_export.json 2>> "$log"
  tail -1 /tmp/gpt2_export.json >> "$log"
  step gpt2_protean_graphs 30 env PROTEAN_LOGS=perf_hints,recompiles "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" \
    reduce-overhead --steady --mode=reduce-overhead > "$OUT/gpt2_protean_graphs.json" 2>> "$log"
  step gpt2_protean_default 20 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" default --steady \
    > "$OUT/gpt2_protean_default.json" 2>> "$log"
  step gpt2_torch_graphs 80 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
    > "$OUT/gpt2_torch_graphs.json" 2> /tmp/gpt2_torch.log
  tail -c 3000 /tmp/gpt2_torch.log >> "$log"
  step protean_bench 10 "$BIN/protean_cuda_bench" --graphs > "$OUT/protean_graphs.json" 2>> "$log"
  left=$((255 - SECONDS)); [ "$left" -lt 10 ] && left=10  # what the call's time limit leaves
  step memcheck "$left" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/protean_cuda_tests" --gtest_filter='CudaGpuGraphs.*' > "$OUT/memcheck.log" 2>&1
  echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
  tail -3 "$OUT/tests.log"
  grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1
  exit 0
fi
step tests 35 "$BIN/protean_cuda_tests" --gtest_filter='CudaGraphs*:CudaGpuGraphs*' > "$OUT/tests.log" 2>&1
step protean_bench 35 "$BIN/protean_cuda_bench" --graphs > "$OUT/protean_graphs.json" 2> "$OUT/bench.err"
step torch_bench 85 python3 "$SRC/bench/gpu/torch_graphs_bench.py" > "$OUT/torch_graphs.json" 2>> "$OUT/bench.err"
step memcheck 38 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$BIN/protean_cuda_tests" --gtest_filter='CudaGpuGraphs.*' > "$OUT/memcheck.log" 2>&1
STATUS="{$(IFS=,; echo "${status[*]}")}" COMMIT=$COMMIT OUT=$OUT python3 - <<'PY'
import json, os
out = os.environ["OUT"]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        return {"error": repr(e)}
p, t = load("protean_graphs.json"), load("torch_graphs.json")
env = open(os.path.join(out, "env.txt")).read()
res = {"benchmark": "mode reduce-overhead (CUDA graphs per size bucket) vs plain launches vs torch.compile, same run",
       "commit": os.environ["COMMIT"], "device": p.get("device") or t.get("device"), "env": env,
       "steps": json.loads(os.environ["STATUS"]), "protean": p, "torch": t}
json.dump(res, open(os.path.join(out, "graphs_bench.json"), "w"), indent=1)
print("steps:", os.environ["STATUS"])
for side, d in (("protean", p), ("torch", t)):
    for mode in ("default", "reduce-overhead"):
        rows = d.get(mode, {}).get("sizes", []) if isinstance(d.get(mode), dict) else []
        print(side, mode, [(r["n"], r["host_us_median"], r["first_call_ms"]) for r in rows])
PY
tail -3 "$OUT/tests.log"
grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1
