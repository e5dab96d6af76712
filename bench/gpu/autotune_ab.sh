#!/usr/bin/env bash
# GPT-2 small under max-autotune against reduce-overhead, both from warm caches, alternating, on one GPU
# in one device call: bench/gpu/autotune_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. a first run of each build with its own empty cache (the compiles, the cuBLASLt table and, for
#      max-autotune, every bucket tuned), PROTEAN_LOGS=graphs: what the tuning changed, per bucket.
#      Builds: ro (reduce-overhead), ma (max-autotune), mv (max-autotune with PROTEAN_AUTOTUNE_VARIANTS=0:
#      cuBLASLt algorithms and threads per row tuned, no row-kernel variants);
#   2. ROUNDS rounds (default 3), each running the three from their caches, the order rotating by
#      round, so drift over the call does not fall on one build.
# OUTDIR: steps.log, tuning.log (the max-autotune lines), runs.json (every run's protean_gpt2_bench JSON).
set -uo pipefail
OUT=${1:?usage: bench/gpu/autotune_ab.sh OUTDIR}
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
RUNS=/tmp/protean-autotune-runs
rm -rf "$RUNS" /tmp/pc-ab-ro /tmp/pc-ab-ma /tmp/pc-ab-mv
mkdir -p "$RUNS"
run_mode() {  # run_mode NAME MODE CACHE [ENV...]
  local name=$1 mode=$2 cache=$3
  shift 3
  step "$name" 90 env PROTEAN_CACHE_DIR="$cache" "$@" "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "$name" --steady \
    --mode="$mode" > "$RUNS/$name.json" 2> "$RUNS/$name.err"
}
run_build() {  # run_build BUILD NAME [ENV...]
  local b=$1 name=$2
  shift 2
  case $b in
    ro) run_mode "$name" reduce-overhead /tmp/pc-ab-ro "$@" ;;
    ma) run_mode "$name" max-autotune /tmp/pc-ab-ma "$@" ;;
    mv) run_mode "$name" max-autotune /tmp/pc-ab-mv PROTEAN_AUTOTUNE_VARIANTS=0 "$@" ;;
  esac
}
for b in ro ma mv; do run_build $b "${b}_fresh" PROTEAN_LOGS=graphs; done
{ echo "== ma"; grep -h "max-autotune" "$RUNS/ma_fresh.err"; echo "== mv"; grep -h "max-autotune" "$RUNS/mv_fresh.err"; } > "$OUT/tuning.log" 2>/dev/null
for round in $(seq 1 "${ROUNDS:-3}"); do
  case $((round % 3)) in 1) order="ro ma mv" ;; 2) order="ma mv ro" ;; 0) order="mv ro ma" ;; esac
  for b in $order; do run_build $b "${b}_warm_$round"; done
done
RUNS=$RUNS python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.environ["RUNS"] + "/*.json")):
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
    print(name, json.dumps(steady), "plain", d.get("graph_plain_runs"), "rel_l2", d.get("worst_rel_l2_vs_torch_bf16"))
PY
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
