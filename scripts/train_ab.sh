#!/bin/bash
# A/B of the compiled training step between two builds of libprotean, in alternating fresh processes:
#   scripts/train_ab.sh OLD_LIB_DIR MODEL STEPS ROUNDS [THREADS]
# OLD_LIB_DIR holds the other build's libprotean.so.0 (e.g. a copy of main's build/libprotean.so.0);
# both runs use this tree's build/train_bench (the library is loaded through LD_LIBRARY_PATH for "old").
# Each run is `train_bench --child MODEL protean_compiled STEPS THREADS` with an empty kernel cache;
# printed: the median, min and max over the rounds after the first of the steady CPU ms per step, the
# median steps/s, the last loss and the 1-minute load.
set -euo pipefail
OLD=$1 M=$2 N=$3 R=$4 T=${5:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export OMP_WAIT_POLICY=passive
for r in $(seq "$R"); do
  for v in old new; do
    dir=$(mktemp -d)
    if [ $v = old ]; then
      out=$(LD_LIBRARY_PATH="$OLD" PROTEAN_CACHE_DIR=$dir "$ROOT/build/train_bench" --child "$M" protean_compiled "$N" "$T" 2>&1 | tail -1)
    else
      out=$(PROTEAN_CACHE_DIR=$dir "$ROOT/build/train_bench" --child "$M" protean_compiled "$N" "$T" 2>&1 | tail -1)
    fi
    rm -rf "$dir"
    echo "$v $(echo "$out" | python3 -c "
import json, sys, statistics as st
d = json.loads(sys.stdin.read()[6:])
c, w = d['steady_cpu_ms_per_step'], d['steady_steps_per_s']
print('cpu_ms median %.2f min %.2f max %.2f | steps/s median %.2f | loss %s | load %s' % (
    st.median(c), min(c), max(c), st.median(w), d['last_loss'], open('/proc/loadavg').read().split()[0]))")"
  done
done
