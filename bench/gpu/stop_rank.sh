#!/bin/bash
# A stopped rank on 2 GPUs: bench/gpu/stop_rank.sh PREBUILT.txz (bench/gpu/pack.sh makes the tree). Rank 1 of
# `protean launch --nproc 2 -- example_ddp_char_gpt --device cuda` gets SIGSTOP 2 s and 6 s after the start;
# rank 0 must end with a timeout error naming it (PROTEAN_COLLECTIVES_TIMEOUT_S=5, PROTEAN_NCCL_TIMEOUT_S=10),
# leave NCCL with abort and exit, and the launcher must then stop rank 1 and return.
PRE=${1:?usage: stop_rank.sh PREBUILT.txz}
W=$(mktemp -d); tar xJf "$PRE" -C $W
export LD_LIBRARY_PATH=$W/lib NCCL_NVLS_ENABLE=0 PROTEAN_COLLECTIVES_TIMEOUT_S=5 PROTEAN_NCCL_TIMEOUT_S=10
export PROTEAN_NCCL_LIBRARY=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')/lib/libnccl.so.2
for delay in 2 6; do
  export PROTEAN_CACHE_DIR=$(mktemp -d)
  t0=$SECONDS
  timeout 60 $W/bin/protean launch --nproc 2 -- $W/bin/example_ddp_char_gpt --device cuda --steps 100000 --lengths per-rank > /tmp/stop_$delay.txt 2>&1 &
  L=$!
  sleep $delay
  for p in $(pgrep -f "bin/example_ddp_char_gpt"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "PROTEAN_RANK=1"; then kill -STOP $p; echo "stopped rank 1 (pid $p) at ${delay}s"; fi
  done
  wait $L; rc=$?
  t1=$SECONDS
  echo "delay $delay: launcher rc=$rc after $((t1 - t0)) s (from start; rank 1 stopped at $delay s)"
  grep -E "error|protean launch" /tmp/stop_$delay.txt | cut -c1-300 | tail -4
  pkill -9 -f "bin/example_ddp_char_gpt" 2>/dev/null
  sleep 1
done
