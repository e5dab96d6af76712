#!/usr/bin/env bash
# GPT-2 small on the GPU, Protean against PyTorch in one run: bench/gpu/gpt2_run.sh OUTDIR
#   1. scripts/export_gpt2.py: seeded GPT2Config() model, fp32 ONNX with a dynamic sequence axis, token
#      ids and PyTorch's bf16 / f32 outputs per length (work dir /tmp/protean-gpt2);
#   2. protean_gpt2_bench, three processes over the 12 lengths: cold (empty artifact cache, new PGO
#      job), warm (same cache and job: cubins from the cache, PGO's dynamic decision), steady latencies;
#   3. bench/gpu/gpt2_torch.py: eager and torch.compile (default mode) cold with steady latencies,
#      then a second process with Inductor's cache warm;
#   3a. with PROTEAN_GPT2_UNFUSED=1, the steady latencies once more with PROTEAN_CUDA_FUSED_ATTENTION=0
#      (attention as two cuBLASLt products and a softmax kernel), for comparison;
#   3b. where a steady call's time goes: the steady run records host_ms / gpu_ms per length, and with
#      ncu present (PROTEAN_GPT2_NCU=0 skips it) one call at length 256 (PROTEAN_GPT2_NCU_LEN) is profiled: every launch with
#      its duration (OUTDIR/gpt2_ncu.csv, summarized as `profile` in the JSON);
#   3c. GPT-2 small on the CPU against ONNX Runtime's CPU provider (PROTEAN_GPT2_CPU=0 skips it):
#      bench/gpu/gpt2_ort.py writes ORT's outputs for a few lengths as .npy, protean_gpt2_cpu_bench
#      runs the same float32 model with backend interp and backend cpu (which needs a C++ compiler on
#      this machine: g++ or $PROTEAN_CXX) with the sequence length dynamic, compared by max abs/rel error;
#   (PROTEAN_GPT2_TORCH=0 skips PyTorch's steps: a profiling run that needs no ratio)
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
. "$SRC/bench/gpu/common.sh"  # cuda_library_path, step NAME TIMEOUT_S CMD...
cuda_library_path
COMMIT=$(cat "$SRC/COMMIT" 2>/dev/null || git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)
WORK=${PROTEAN_GPT2_WORK:-/tmp/protean-gpt2}
CACHE=/tmp/protean-gpt2-cache
rm -rf "$CACHE" /tmp/protean-gpt2-inductor
mkdir -p "$WORK"
status=()
{ uptime; nproc; ${PROTEAN_CXX:-g++} --version 2>&1 | head -1; } > "$OUT/gpt2_env.txt"
step export 150 python3 "$SRC/scripts/export_gpt2.py" "$WORK" > "$OUT/gpt2_export.json" 2> "$OUT/gpt2_export.log"
export PROTEAN_CACHE_DIR=$CACHE PROTEAN_JOB_ID=gpt2-bench
step protean_cold 90 env PROTEAN_LOGS=perf_hints,graph_breaks,recompiles,cache "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" cold \
  > "$OUT/gpt2_protean_cold.json" 2> "$OUT/gpt2_protean.log"
step protean_warm 60 env PROTEAN_LOGS=cache "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" warm \
  > "$OUT/gpt2_protean_warm.json" 2>> "$OUT/gpt2_protean.log"
step protean_steady 60 "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" steady --steady \
  > "$OUT/gpt2_protean_steady.json" 2>> "$OUT/gpt2_protean.log"
if [ "${PROTEAN_GPT2_UNFUSED:-0}" = 1 ]; then  # the same with attention as two products and a softmax
  step protean_steady_unfused 90 env PROTEAN_CUDA_FUSED_ATTENTION=0 PROTEAN_CACHE_DIR=$CACHE-unfused PROTEAN_JOB_ID=gpt2-unfused \
    "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" steady_unfused --steady > "$OUT/gpt2_protean_steady_unfused.json" 2>> "$OUT/gpt2_protean.log"
fi
if command -v ncu > /dev/null && [ "${PROTEAN_GPT2_NCU:-1}" = 1 ]; then
  step protean_ncu 90 ncu --clock-control none --profile-from-start off --csv --page raw \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
    "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" profile --profile-call "${PROTEAN_GPT2_NCU_LEN:-256}" > "$OUT/gpt2_ncu.csv" 2>> "$OUT/gpt2_protean.log"
fi
unset PROTEAN_CACHE_DIR PROTEAN_JOB_ID
export TORCHINDUCTOR_CACHE_DIR=/tmp/protean-gpt2-inductor
# PROTEAN_GPT2_TORCH=0 skips PyTorch's two runs (about 2 minutes): Protean's side alone
[ "${PROTEAN_GPT2_TORCH:-1}" = 1 ] && step torch_cold 150 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" cold > "$OUT/gpt2_torch_cold.json" 2> "$OUT/gpt2_torch.log"
if [ "${PROTEAN_GPT2_CPU:-1}" = 1 ]; then
  step ort_cpu 90 python3 "$SRC/bench/gpu/gpt2_ort.py" "$WORK" > "$OUT/gpt2_ort.json" 2> "$OUT/gpt2_cpu.log"
  for b in interp cpu; do
    step "protean_cpu_$b" 150 env PROTEAN_CACHE_DIR=/tmp/protean-gpt2-cpu-cache PROTEAN_LOGS=perf_hints,graph_breaks,recompiles \
      "$BIN/protean_gpt2_cpu_bench" "$WORK/gpt2.onnx" "$WORK" "$b" > "$OUT/gpt2_cpu_$b.json" 2>> "$OUT/gpt2_cpu.log"
  done
fi
[ "${PROTEAN_GPT2_TORCH:-1}" = 1 ] && step torch_warm 60 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" warm --first-only > "$OUT/gpt2_torch_warm.json" 2>> "$OUT/gpt2_torch.log"

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
     "protean": {k: load(f"gpt2_protean_{k}.json") for k in ("cold", "warm", "steady", "steady_unfused")},
     "torch": {k: load(f"gpt2_torch_{k}.json") for k in ("cold", "warm")},
     "cpu_vs_ort": {"ort": load("gpt2_ort.json"), "interp": load("gpt2_cpu_interp.json"), "cpu": load("gpt2_cpu_cpu.json")}}
def ncu_profile(path):  # one steady call under ncu: launches, GPU time, the longest kernels
    import csv
    try:
        rows = list(csv.reader(open(path)))
    except OSError as e:
        return {"error": repr(e)}
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        return {"error": "no ncu table"}
    cols, units = rows[head], rows[head + 1]
    name, t = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(units[t], 1.0)
    per = {}
    total = 0.0
    launches = 0
    for r in rows[head + 2:]:
        if len(r) <= t or not r[t]:
            continue
        us = float(r[t].replace(",", "")) * scale
        launches += 1
        total += us
        k = r[name].split("(")[0]
        c = per.setdefault(k, [0, 0.0])
        c[0] += 1
        c[1] += us
    blas = sum(v[1] for k, v in per.items() if not (k.startswith("kernel") or k.startswith("ext")))
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:15]
    return {"seq": int(os.environ.get("PROTEAN_GPT2_NCU_LEN", "256")), "note": "ncu, one steady call: each launch timed alone after ncu's cache flush, so the sum overstates the back-to-back GPU time",
            "launches": launches, "gpu_busy_us": round(total, 1), "library_kernels_us": round(blas, 1),
            "top": [{"kernel": k, "launches": v[0], "us": round(v[1], 1)} for k, v in top]}
r["profile"] = ncu_profile(os.path.join(out, "gpt2_ncu.csv"))
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
    un = next((u for u in p["steady_unfused"].get("lengths", []) if u["seq"] == L["seq"]), {})
    rows.append({"seq": L["seq"], "protean_ms": pm, "protean_worst_ms": L.get("steady_ms", {}).get("worst"),
                 "protean_host_ms": L.get("host_ms"), "protean_gpu_ms": L.get("gpu_ms"),
                 "protean_unfused_attention_ms": un.get("steady_ms", {}).get("median"),
                 "torch_compile_ms": tc.get("median"), "torch_compile_worst_ms": tc.get("worst"), "torch_eager_ms": te.get("median"),
                 "speedup_vs_compile": round(tc["median"] / pm, 3) if pm and tc.get("median") else None,
                 "rel_l2_vs_torch_bf16": L["vs_torch_bf16"]["rel_l2"], "torch_bf16_vs_f32_rel_l2": L["torch_bf16_vs_torch_f32"]["rel_l2"]})
summary["steady"] = rows
summary["profile"] = r["profile"]
summary["cpu_vs_ort"] = {b: {"compiles": r["cpu_vs_ort"][b].get("compiles"), "worst_max_abs": r["cpu_vs_ort"][b].get("worst_max_abs_vs_ort"),
                             "worst_max_rel": r["cpu_vs_ort"][b].get("worst_max_rel_vs_ort")} for b in ("interp", "cpu")}
r["summary"] = summary
json.dump(r, open(os.path.join(out, "gpt2_bench.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
