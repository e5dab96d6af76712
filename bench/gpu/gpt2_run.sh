#!/usr/bin/env bash
# GPT-2 small on the GPU, Protean against PyTorch in one run: bench/gpu/gpt2_run.sh OUTDIR
#   1. scripts/export_gpt2.py: seeded GPT2Config() model, fp32 ONNX with a dynamic sequence axis, token
#      ids and PyTorch's bf16 / f32 outputs per length (work dir /tmp/protean-gpt2);
#   2. protean_gpt2_bench, three processes over the 12 lengths: cold (empty artifact cache, new PGO
#      job), warm (same cache and job: cubins from the cache, PGO's dynamic decision), steady latencies;
#   3. bench/gpu/gpt2_torch.py: eager and torch.compile (default mode) cold with steady latencies,
#      then a second process with Inductor's cache warm;
#   4. OUTDIR/gpt2_bench.json: everything merged with the device and commit.
# Binaries: $PROTEAN_GPU_BIN, else the prebuilt tree's bin (bench/gpu/pack.sh), else ./build.
set -uo pipefail
OUT=${1:?usage: bench/gpu/gpt2_run.sh OUTDIR}
mkdir -p "$OUT"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PREBUILT=${PROTEAN_GPU_PREBUILT:-$SRC/../prebuilt}
BIN=${PROTEAN_GPU_BIN:-}
if [ -z "$BIN" ]; then
  if [ -x "$PREBUILT/bin/protean_gpt2_bench" ]; then BIN=$PREBUILT/bin; export LD_LIBRARY_PATH=$PREBUILT/lib:${LD_LIBRARY_PATH:-}
  elif [ -x /tmp/protean-prebuilt/bin/protean_gpt2_bench ]; then BIN=/tmp/protean-prebuilt/bin; export LD_LIBRARY_PATH=/tmp/protean-prebuilt/lib:${LD_LIBRARY_PATH:-}
  else BIN=$SRC/build; fi
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# NVRTC and cuBLASLt: the toolkit's, else the copies PyTorch's wheels bring (as run.sh finds them).
for lib in libnvrtc.so.13 libcublasLt.so.13; do
  if [ ! -e "/usr/local/cuda/lib64/$lib" ] && ! ldconfig -p | grep -q "$lib"; then
    p=$(find /usr/local /opt -name "$lib" 2>/dev/null | head -1)
    [ -n "$p" ] && export LD_LIBRARY_PATH=$(dirname "$p"):$LD_LIBRARY_PATH
  fi
done
COMMIT=$(cat "$SRC/COMMIT" 2>/dev/null || git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)
WORK=${PROTEAN_GPT2_WORK:-/tmp/protean-gpt2}
CACHE=/tmp/protean-gpt2-cache
rm -rf "$CACHE" /tmp/protean-gpt2-inductor
mkdir -p "$WORK"
status=()
step() {  # step NAME TIMEOUT_S CMD... : runs, records the exit status and seconds
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  status+=("\"$name\": {\"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
  echo "== $name: rc=$rc in $((SECONDS - t0)) s" >&2
  return 0
}
uptime > "$OUT/gpt2_env.txt"
step export 150 python3 "$SRC/scripts/export_gpt2.py" "$WORK" > "$OUT/gpt2_export.json" 2> "$OUT/gpt2_export.log"
export PROTEAN_CACHE_DIR=$CACHE PROTEAN_JOB_ID=gpt2-bench
step protean_cold 90 env PROTEAN_LOGS=perf_hints,graph_breaks,recompiles "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" cold \
  > "$OUT/gpt2_protean_cold.json" 2> "$OUT/gpt2_protean.log"
step protean_warm 60 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" warm \
  > "$OUT/gpt2_protean_warm.json" 2>> "$OUT/gpt2_protean.log"
step protean_steady 60 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" steady --steady \
  > "$OUT/gpt2_protean_steady.json" 2>> "$OUT/gpt2_protean.log"
unset PROTEAN_CACHE_DIR PROTEAN_JOB_ID
export TORCHINDUCTOR_CACHE_DIR=/tmp/protean-gpt2-inductor
# PROTEAN_GPT2_TORCH=0 skips PyTorch's two runs (about 2 minutes): Protean's side alone
if [ "${PROTEAN_GPT2_TORCH:-1}" = 1 ]; then
  step torch_cold 150 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" cold > "$OUT/gpt2_torch_cold.json" 2> "$OUT/gpt2_torch.log"
  step torch_warm 60 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" warm --first-only > "$OUT/gpt2_torch_warm.json" 2>> "$OUT/gpt2_torch.log"
fi

STATUS="{$(IFS=,; echo "${status[*]}")}" COMMIT=$COMMIT OUT=$OUT python3 - <<'PY'
import json, os
out = os.environ["OUT"]
def load(name):  # the file as JSON, else its last line (the exporter prints progress lines first)
    try:
        text = open(os.path.join(out, name)).read()
        try:
            return json.loads(text)
        except ValueError:
            return json.loads([l for l in text.splitlines() if l.startswith("{")][-1])
    except Exception as e:  # a failed step: keep its error text
        return {"error": repr(e)}
r = {"benchmark": "GPT-2 small (GPT2Config(), seeded random init) from ONNX, bf16, Protean backend cuda vs PyTorch, same run",
     "commit": os.environ["COMMIT"], "steps": json.loads(os.environ["STATUS"]),
     "load_average": open(os.path.join(out, "gpt2_env.txt")).read().strip(),
     "export": load("gpt2_export.json"),
     "protean": {k: load(f"gpt2_protean_{k}.json") for k in ("cold", "warm", "steady")},
     "torch": {k: load(f"gpt2_torch_{k}.json") for k in ("cold", "warm")}}
r["device"] = r["protean"]["cold"].get("device") or r["torch"]["cold"].get("device")
p, t = r["protean"], r["torch"]
summary = {}
for k in ("cold", "warm"):
    summary[f"first_results_s_{k}"] = {"protean": p[k].get("first_results_s"), "torch_compile": t[k].get("compile_default", {}).get("first_results_s")}
    summary[f"compiles_{k}"] = {"protean": p[k].get("compiles_first_results"), "torch_compile_unique_graphs": t[k].get("compile_default", {}).get("unique_graphs")}
rows = []
for L in p["steady"].get("lengths", []):
    s = str(L["seq"])
    tc = t["cold"].get("compile_default", {}).get("steady", {}).get(s, {})
    te = t["cold"].get("eager", {}).get(s, {})
    pm = L.get("steady_ms", {}).get("median")
    rows.append({"seq": L["seq"], "protean_ms": pm, "protean_worst_ms": L.get("steady_ms", {}).get("worst"),
                 "torch_compile_ms": tc.get("median"), "torch_compile_worst_ms": tc.get("worst"), "torch_eager_ms": te.get("median"),
                 "speedup_vs_compile": round(tc["median"] / pm, 3) if pm and tc.get("median") else None,
                 "rel_l2_vs_torch_bf16": L["vs_torch_bf16"]["rel_l2"], "torch_bf16_vs_f32_rel_l2": L["torch_bf16_vs_torch_f32"]["rel_l2"]})
summary["steady"] = rows
r["summary"] = summary
json.dump(r, open(os.path.join(out, "gpt2_bench.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
