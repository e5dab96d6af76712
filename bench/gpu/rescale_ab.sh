#!/usr/bin/env bash
# The attention's lazy rescale against rescaling at every key tile, and max-autotune's tuning on the
# calling thread, on one GPU in one device call: bench/gpu/rescale_ab.sh OUTDIR
# (a prebuilt tree from bench/gpu/pack.sh in $PROTEAN_GPU_PREBUILT, or .gpu/prebuilt.tgz of the source tree).
#   1. the cuda tests on the device (CudaGpu*, CudaGraphs*, CudaGpuGraphs*), with the lazy rescale;
#   2. two rounds, each alternating PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1 and =0:
#      the attention kernel alone (protean_cuda_bench --attention) and GPT-2 small under reduce-overhead
#      (protean_gpt2_bench --steady, lengths of scripts/export_gpt2.py);
#   3. GPT-2 small under max-autotune (a fresh cache: every bucket tuned in this run);
#   4. torch.compile reduce-overhead on the same model (bench/gpu/gpt2_torch.py).
# OUTDIR: steps.log, attention.json, gpt2_runs.json, gpt2_torch.json, tests.log.
# RESCALE_AB_SHORT=1: one round, no tests and no torch (a short call).
set -uo pipefail
OUT=${1:?usage: bench/gpu/rescale_ab.sh OUTDIR}
mkdir -p "$OUT"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/gpu/common.sh"  # use_prebuilt, cuda_library_path, step NAME TIMEOUT_S CMD...
use_prebuilt || exit 1
cuda_library_path
export PROTEAN_SOURCE_DIR=$SRC
log=$OUT/steps.log
{ echo "commit $(cat "$SRC/.gpu/COMMIT" 2>/dev/null || echo unknown)"; nvidia-smi -L; uptime; } > "$log" 2>&1
status=()
SHORT=${RESCALE_AB_SHORT:-0}
if [ "$SHORT" = 1 ]; then  # the attention's GPU test with the lazy rescale only
  step tests 60 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1 "$BIN/protean_cuda_tests" --gtest_filter='CudaGpu.FusedAttention*' > /tmp/tests.log 2>&1
else
  step tests 150 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1 "$BIN/protean_cuda_tests" --gtest_filter='CudaGpu*:CudaGraphs*:CudaGpuGraphs*' > /tmp/tests.log 2>&1
fi
grep -E "FAILED|PASSED|SKIPPED|Failure" /tmp/tests.log | head -20 > "$OUT/tests.log"
WORK=/tmp/protean-gpt2
mkdir -p "$WORK"
[ -f "$WORK/gpt2.onnx" ] || step export 90 python3 "$SRC/scripts/export_gpt2.py" "$WORK" > /tmp/gpt2_export.json 2>> "$log"
RUNS=/tmp/protean-rescale-runs
mkdir -p "$RUNS"
rounds="1 2"; [ "$SHORT" = 1 ] && rounds=1
for round in $rounds; do
  for lazy in 1 0; do
    step "attention_lazy${lazy}_$round" 60 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=$lazy PROTEAN_CACHE_DIR=/tmp/pc-attn-$lazy \
      "$BIN/protean_cuda_bench" --attention > "$RUNS/attention_lazy${lazy}_$round.json" 2>> /tmp/attention.log
    step "ro_lazy${lazy}_$round" 60 env PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=$lazy PROTEAN_CACHE_DIR=/tmp/pc-ro-$lazy \
      "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" "ro_lazy$lazy" --steady --mode=reduce-overhead \
      > "$RUNS/ro_lazy${lazy}_$round.json" 2>> "$log"
  done
done
step max_autotune 120 env PROTEAN_CACHE_DIR=/tmp/pc-ma-fresh "$BIN/protean_gpt2_bench" "$WORK/gpt2.onnx" "$WORK" max_autotune \
  --steady --mode=max-autotune > "$RUNS/max_autotune.json" 2>> "$log"
RUNS=$RUNS python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs, attn = {}, {}
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
    (attn if name.startswith("attention") else runs)[name] = d
json.dump(runs, open(os.path.join(out, "gpt2_runs.json"), "w"))
json.dump(attn, open(os.path.join(out, "attention.json"), "w"))
PY
[ "$SHORT" = 1 ] || step torch 100 python3 "$SRC/bench/gpu/gpt2_torch.py" "$WORK" reduce-overhead --reduce-overhead \
  > "$OUT/gpt2_torch.json" 2> /tmp/gpt2_torch.log
echo "steps: {$(IFS=,; echo "${status[*]}")}" >> "$log"
tail -3 /tmp/tests.log
