# Shared by the GPU scripts (run.sh, gpt2_run.sh, graphs.sh, sizes_ab.sh, ncu_graph.sh, rescale_ab.sh,
# autotune_ab.sh, cache_ab.sh, attention_peers.sh, gpt2_same_run.sh, generated_products_ab.sh, split_k_ab.sh, modes_ab.sh, tuning_ab.sh,
# launch_knobs_ab.sh, first_call_ab.sh);
# sourced, not run.

# The prebuilt tree of bench/gpu/pack.sh: $PROTEAN_GPU_PREBUILT, else $SRC/.gpu/prebuilt.tgz unpacked
# into /tmp/protean-prebuilt. Sets PREBUILT and BIN and puts its libraries (and CUDA's) on
# LD_LIBRARY_PATH; non-zero when the archive cannot be unpacked.
use_prebuilt() {
  PREBUILT=${PROTEAN_GPU_PREBUILT:-}
  if [ -z "$PREBUILT" ]; then
    PREBUILT=/tmp/protean-prebuilt
    mkdir -p "$PREBUILT"
    tar xzf "$SRC/.gpu/prebuilt.tgz" -C "$PREBUILT" || return 1
  fi
  BIN=$PREBUILT/bin
  export LD_LIBRARY_PATH=$PREBUILT/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
}

# Adds the folder of CUDA 13's NVRTC and cuBLASLt to LD_LIBRARY_PATH where the loader would not find
# them (neither in /usr/local/cuda/lib64 nor known to ldconfig): the copies PyTorch's wheels bring.
cuda_library_path() {
  local lib p
  for lib in libnvrtc.so.13 libcublasLt.so.13; do
    if [ ! -e "/usr/local/cuda/lib64/$lib" ] && ! ldconfig -p | grep -q "$lib"; then
      p=$(find /usr/local /opt -name "$lib" 2>/dev/null | head -1)
      [ -n "$p" ] && export LD_LIBRARY_PATH=$(dirname "$p"):$LD_LIBRARY_PATH
    fi
  done
  return 0
}

# step NAME TIMEOUT_S CMD...: runs CMD under the time limit, appends "NAME": {"rc", "seconds"} to the
# array `status` and prints "== NAME: rc=RC in S s" on stderr; returns 0 whatever CMD did, so the
# next step still runs.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  status+=("\"$name\": {\"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
  echo "== $name: rc=$rc in $((SECONDS - t0)) s" >&2
  return 0
}

# gpu_setup OUT: the prebuilt tree (use_prebuilt; exits when it cannot be unpacked), CUDA's libraries,
# PROTEAN_SOURCE_DIR, and OUT/steps.log (as $log) begun with the commit, the GPU and the uptime; an empty
# `status` for step. Needs SRC.
gpu_setup() {
  mkdir -p "$1"
  use_prebuilt || exit 1
  cuda_library_path
  export PROTEAN_SOURCE_DIR=$SRC
  log=$1/steps.log
  { echo "commit $(cat "$SRC/.gpu/COMMIT" 2>/dev/null || echo unknown)"; nvidia-smi -L; uptime; } > "$log" 2>&1
  status=()
}

# gpt2_model: GPT-2 small exported into WORK=/tmp/protean-gpt2 (scripts/export_gpt2.py), once per machine.
gpt2_model() {
  WORK=/tmp/protean-gpt2
  mkdir -p "$WORK"
  [ -f "$WORK/gpt2.onnx" ] || step export 90 python3 "$SRC/scripts/export_gpt2.py" "$WORK" > /tmp/gpt2_export.json 2>> "$log"
}

# gpt2_steady NAME MODE LIMIT_S ENV...: protean_gpt2_bench --steady in MODE with ENV as step NAME under
# LIMIT_S, its JSON into $RUNS/NAME.json, its warnings and errors appended to $log. Needs BIN, WORK, RUNS.
gpt2_steady() {
  local name=$1 mode=$2 limit=$3
  shift 3
  step "$name" "$limit" env "$@" "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "$name" --steady --mode="$mode" \
    > "$RUNS/$name.json" 2> "/tmp/$name.log"
  grep -h -E "W protean|error" "/tmp/$name.log" | head -5 >> "$log"
}

# gpu_tests_gated OUTFILE GATE_FILTER LIMIT_S: the cuda tests GATE_FILTER under a short limit (their
# summary lines, and the log's tail when they fail, into OUTFILE; non-zero when they fail, so the caller
# can end the call there), then CudaGpu* and CudaGpuGraphs* as step `tests` under LIMIT_S.
gpu_tests_gated() {
  local out=$1 gate=$2 limit=$3
  timeout 60 "$BIN/protean_cuda_tests" --gtest_filter="$gate" > /tmp/gate_test.log 2>&1
  local rc=$?
  grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which is|rows|error|W protean" /tmp/gate_test.log | head -40 > "$out"
  if [ $rc -ne 0 ]; then
    echo "gate tests $gate: rc=$rc" >> "$log"
    tail -40 /tmp/gate_test.log >> "$out"
    return 1
  fi
  step tests "$limit" "$BIN/protean_cuda_tests" --gtest_filter='CudaGpu*:CudaGpuGraphs*' > /tmp/tests.log 2>&1
  grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which is|rows|error" /tmp/tests.log | head -60 >> "$out"
}

# gpt2_ab_begin OUT: the start of the GPT-2 A/B scripts (launch_knobs_ab.sh, first_call_ab.sh):
# gpu_setup OUT, the attention and indexing tests as the gate (the whole script ends, exit 0, when they
# fail) then CudaGpu* / CudaGpuGraphs*, the exported model (gpt2_model), RUNS=OUT/runs, and no
# compile caches left from an earlier script (/tmp/pc-*). Needs SRC.
gpt2_ab_begin() {
  gpu_setup "$1"
  gpu_tests_gated "$1/tests.log" "CudaGpu.IndexingKernelsMatchEager:CudaGpu.*Attention*" 200 || exit 0
  gpt2_model
  RUNS=$1/runs
  mkdir -p "$RUNS"
  rm -rf /tmp/pc-*
}

# gpt2_mode_run BUILD NAME: a steady GPT-2 run (gpt2_steady) as NAME of BUILD ro (reduce-overhead) or
# mg (max-autotune), each with its own cache directory kept across the script's runs; 1 for any other.
gpt2_mode_run() {
  case $1 in
    ro) gpt2_steady "$2" reduce-overhead 60 PROTEAN_CACHE_DIR=/tmp/pc-ro ;;
    mg) gpt2_steady "$2" max-autotune 120 PROTEAN_CACHE_DIR=/tmp/pc-mg ;;
    *) return 1 ;;
  esac
}
