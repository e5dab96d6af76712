#!/usr/bin/env bash
# All GPU work of the cuda backend in one call: bench/gpu/run.sh OUTDIR
#   1. build: uses the prebuilt tree in $PROTEAN_GPU_PREBUILT (default: ../prebuilt beside the source
#      tree, or ../*.tgz unpacked; bench/gpu/pack.sh makes it: the binaries below plus the shared
#      libraries the GPU machine lacks — oneDNN, libonnx, protobuf, hiredis, libdw, ...), else
#      configures and builds
#      protean_cuda_tests and protean_cuda_bench here with cmake (needs those -dev packages);
#   2. GPU tests: protean_cuda_tests (fake-driver and real-device suites);
#   3. benchmarks: protean_cuda_bench and torch_bench.py in the same run, merged into
#      OUTDIR/cuda_bench.json with the device, driver and commit;
#   3b. ncu (when present): time, DRAM bytes and throughput, registers and occupancy of every
#      benchmark kernel, one profiled pass (OUTDIR/ncu.csv);
#   3c. with PROTEAN_GPU_GPT2=1, bench/gpu/gpt2_run.sh (GPT-2 small from ONNX vs PyTorch);
#   4. compute-sanitizer memcheck of the small GPU suite (CudaGpuSmall.*), last: it is the slowest.
# Every step's log goes to OUTDIR; a failing step is recorded and the next one still runs.
set -uo pipefail
OUT=${1:?usage: bench/gpu/run.sh OUTDIR}
mkdir -p "$OUT"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PREBUILT=${PROTEAN_GPU_PREBUILT:-$SRC/../prebuilt}
# A prebuilt tree may also travel as gzipped tarballs beside the source (DIR/*.tgz, each holding bin/
# and/or lib/): they are unpacked into /tmp/protean-prebuilt.
if [ ! -d "$PREBUILT" ] && ls "$SRC"/../*.tgz > /dev/null 2>&1; then
  mkdir -p /tmp/protean-prebuilt
  for t in "$SRC"/../*.tgz; do tar xzf "$t" -C /tmp/protean-prebuilt; done
  PREBUILT=/tmp/protean-prebuilt
fi
COMMIT=$(cat "$SRC/COMMIT" 2>/dev/null || git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)
status=()
. "$SRC/bench/gpu/common.sh"  # step NAME TIMEOUT_S CMD..., cuda_library_path

{
  echo "commit $COMMIT"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  uname -r
} > "$OUT/env.txt" 2>&1

# ---- 1. build ----
if [ -x "$PREBUILT/bin/protean_cuda_tests" ]; then
  BIN=$PREBUILT/bin
  export LD_LIBRARY_PATH=$PREBUILT/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  echo "build: prebuilt tree $PREBUILT" >> "$OUT/env.txt"
  ldd "$BIN/protean_cuda_tests" | grep -i "not found" >> "$OUT/env.txt"
else
  step build 420 bash -c "cmake -S '$SRC' -B /tmp/protean-gpu-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPROTEAN_BUILD_BENCH=ON > '$OUT/build.log' 2>&1 && \
      cmake --build /tmp/protean-gpu-build -j\$(nproc) --target protean_cuda_tests protean_cuda_bench >> '$OUT/build.log' 2>&1"
  BIN=/tmp/protean-gpu-build
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
fi
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
# NVRTC and cuBLASLt: the toolkit's, else the copies PyTorch's wheels bring.
cuda_library_path
for lib in libnvrtc.so.13 libcublasLt.so.13; do
  echo "$lib: $(ldconfig -p | grep -m1 "$lib" || ls /usr/local/cuda/lib64/$lib 2>&1)" >> "$OUT/env.txt"
done

# ---- 2. GPU tests ----
export PROTEAN_SOURCE_DIR=$SRC  # test data (tests/data)
step tests 90 "$BIN/protean_cuda_tests" --gtest_brief=0 > "$OUT/tests.log" 2>&1

# ---- 3. benchmarks, same run ----
step protean_bench 90 env PROTEAN_LOGS=output_code,perf_hints "$BIN/protean_cuda_bench" > "$OUT/protean_bench.json" 2>> "$OUT/bench.err"
step torch_bench 150 python3 "$SRC/bench/gpu/torch_bench.py" > "$OUT/torch_bench.json" 2>> "$OUT/bench.err"

# ---- 3b. hardware counters of the benchmark kernels (ncu; one timed call per case) ----
# PROTEAN_BENCH_PROFILE=1 makes protean_cuda_bench run each case a few times without its timing loops.
if command -v ncu > /dev/null; then
  step ncu 120 env PROTEAN_BENCH_PROFILE=1 ncu --clock-control none --kernel-name regex:kernel --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__block_size,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_registers,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
    "$BIN/protean_cuda_bench" > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
fi

# ---- 3c. GPT-2 small from ONNX vs PyTorch (bench/gpu/gpt2_run.sh), when asked: PROTEAN_GPU_GPT2=1 ----
if [ "${PROTEAN_GPU_GPT2:-0}" = 1 ]; then
  step gpt2 330 env PROTEAN_GPU_BIN="$BIN" bash "$SRC/bench/gpu/gpt2_run.sh" "$OUT" > "$OUT/gpt2_summary.txt" 2>&1
fi

# ---- 4. memcheck of a small run ----
step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$BIN/protean_cuda_tests" --gtest_filter='CudaGpuSmall.*' > "$OUT/memcheck.log" 2>&1

STATUS="{$(IFS=,; echo "${status[*]}")}" COMMIT=$COMMIT OUT=$OUT python3 - <<'PY'
import json, os
out = os.environ["OUT"]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:  # a failed step: keep its error text
        return {"error": repr(e)}
p, t = load("protean_bench.json"), load("torch_bench.json")
env = open(os.path.join(out, "env.txt")).read()
res = {"benchmark": "cuda backend vs PyTorch, same run", "commit": os.environ["COMMIT"],
       "device": p.get("device") or t.get("device"), "env": env, "steps": json.loads(os.environ["STATUS"]),
       "protean": p, "torch": t}
json.dump(res, open(os.path.join(out, "cuda_bench.json"), "w"), indent=1)
def g(d, *ks):
    for k in ks:
        if not isinstance(d, dict) or k not in d: return None
        d = d[k]
    return d
rows = [("copy GB/s", g(p, "copy", "gb_per_s"), g(t, "copy", "gb_per_s"))]
for op in ("layernorm_gelu_16384x4096_bf16", "softmax_8192x8192_bf16"):
    for pk, tk in (("static", "compile_static"), ("dynamic", "compile_dynamic"), ("dynamic_unbounded", None)):
        rows.append((f"{op} {pk} % of copy", g(p, op, pk, "kernel", "pct_of_copy"), tk and g(t, op, tk, "pct_of_copy")))
    rows.append((f"{op} torch eager %", None, g(t, op, "eager", "pct_of_copy")))
rows.append(("host us trivial (protean / torch.compile)", g(p, "host_overhead_trivial_us", "median"),
             g(t, "host_overhead_trivial_us", "compile", "median")))
rows.append(("host us trivial torch eager", None, g(t, "host_overhead_trivial_us", "eager", "median")))
print("steps:", os.environ["STATUS"])
for name, a, b in rows:
    print(f"{name:55s} protean={a}  torch={b}")
PY
tail -5 "$OUT/tests.log"
grep -E "ERROR SUMMARY|LEAK SUMMARY" "$OUT/memcheck.log" | tail -2
