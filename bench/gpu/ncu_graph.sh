#!/usr/bin/env bash
# Where one steady GPT-2 call's GPU time goes, per kernel, at a few lengths:
# bench/gpu/ncu_graph.sh OUTDIR [LENGTH...] (default 37 512).
# A prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree.
#   1. GPT-2 small exported (scripts/export_gpt2.py);
#   2. per length, `ncu --profile-from-start off` around one steady call (protean_gpt2_bench --profile-call L,
#      the default mode: the kernels a reduce-overhead graph holds, launched one by one; under ncu 2025.3 a
#      reduce-overhead process ended with SIGSEGV and no message on an H100): every kernel timed alone, at
#      the GPU's own clocks, with and without ncu's cache flush (--cache-control all | none: weights from
#      device memory, or what the previous kernels left in L2); OUTDIR/ncu_L<length>_<cache>.csv;
#   3. OUTDIR/ncu_graph.json: per length and cache mode the kernels in launch order (name, grid, block,
#      microseconds), their sum, and the sum per kind (the library's products, attention, the rest);
#   4. the same model's steady latency under reduce-overhead and max-autotune (OUTDIR/steady_*.json).
set -uo pipefail
OUT=${1:?usage: bench/gpu/ncu_graph.sh OUTDIR [LENGTH...]}
shift
LENGTHS=${*:-37 512}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # gpu_setup, gpt2_model, step NAME TIMEOUT_S CMD...
gpu_setup "$OUT"
export PROTEAN_CACHE_DIR=/tmp/protean-gpu-cache
gpt2_model
for L in $LENGTHS; do
  for cache in all none; do
    step "ncu_${L}_$cache" 120 ncu --clock-control none --cache-control "$cache" --profile-from-start off --csv --page raw \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" profile --profile-call "$L" \
      > "$OUT/ncu_L${L}_$cache.csv" 2>> /tmp/ncu_graph.log
  done
done
for mode in reduce-overhead max-autotune; do
  step "steady_$mode" 90 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "$mode" --steady --mode="$mode" \
    > "$OUT/steady_$mode.json" 2>> /tmp/ncu_graph.log
done
OUT=$OUT python3 - > "$OUT/ncu_graph.json" <<'PY'
import csv, glob, json, os, re
out = {}
for path in sorted(glob.glob(os.environ["OUT"] + "/ncu_L*_*.csv")):
    m = re.search(r"ncu_L(\d+)_(\w+)\.csv$", path)
    rows = list(csv.reader(open(path)))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        out[f"{m.group(1)}_{m.group(2)}"] = {"error": "no ncu table", "tail": open(path).read()[-1500:]}
        continue
    cols, units = rows[head], rows[head + 1]
    ci = {c: cols.index(c) for c in cols}
    t = ci["gpu__time_duration.sum"]
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(units[t], 1.0)
    kernels, kinds = [], {}
    for r in rows[head + 2:]:
        if len(r) <= t or not r[t]:
            continue
        us = float(r[t].replace(",", "")) * scale
        name = r[ci["Kernel Name"]]
        short = name.split("(")[0][:90]
        kind = ("attention" if "attention" in name else "generated" if short.startswith(("kernel", "ext", "pt_")) else "library")
        kinds[kind] = round(kinds.get(kind, 0.0) + us, 2)
        kernels.append({"name": short, "grid": r[ci["launch__grid_size"]], "block": r[ci["launch__block_size"]],
                        "regs": r[ci["launch__registers_per_thread"]], "us": round(us, 2)})
    out[f"{m.group(1)}_{m.group(2)}"] = {"launches": len(kernels), "sum_us": round(sum(k["us"] for k in kernels), 1),
                                         "by_kind_us": kinds, "kernels": kernels}
print(json.dumps(out, indent=1))
PY
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
tail -5 /tmp/ncu_graph.log >> "$log"
