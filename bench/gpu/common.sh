# Shared by the GPU scripts (run.sh, gpt2_run.sh, graphs.sh, sizes_ab.sh); sourced, not run.

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
