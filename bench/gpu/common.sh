# Shared by the GPU scripts (run.sh, gpt2_run.sh, graphs.sh, sizes_ab.sh, ncu_graph.sh, rescale_ab.sh);
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
