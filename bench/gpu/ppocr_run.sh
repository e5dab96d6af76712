#!/usr/bin/env bash
# PP-OCRv4 rec and det on the GPU: latency per input width (rec) and image size (det) of Protean's
# cuda backend (--device cuda: the input is copied to the device and the output read back inside each
# timed call), Protean's cpu backend and ONNX Runtime's CPU provider, in the same run, plus the cuda
# output against the cpu backend's at the last shape.
#   bench/gpu/ppocr_run.sh BIN_DIR MODELS_DIR OUTDIR   (BIN_DIR holds `protean`; python3 with onnxruntime)
# Writes OUTDIR/{rec,det}_{cuda,cpu,ort}.json, OUTDIR/*_out/*.npy, OUTDIR/ppocr_gpu.json (merged:
# bench/gpu/ppocr_merge.py) and OUTDIR/ppocr.log. PROTEAN_PPOCR_REPEAT timed calls per shape (default 20;
# the cpu backend a quarter of them), PROTEAN_PPOCR_SECONDS the time budget (default 900).
set -uo pipefail
BIN=${1:?usage: ppocr_run.sh BIN_DIR MODELS_DIR OUTDIR}
MODELS=${2:?}
OUT=${3:?}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
REC_SHAPES="1x3x48x80 1x3x48x160 1x3x48x320 1x3x48x640 1x3x48x960"
DET_SHAPES="1x3x640x320 1x3x640x640 1x3x640x960"
REPEAT=${PROTEAN_PPOCR_REPEAT:-20}
log() { echo "$*" >> "$OUT/ppocr.log"; }
# PROTEAN_PPOCR_SECONDS: the whole run's budget; each step's timeout is cut to what is left (at least 5 s)
BUDGET_END=$(( SECONDS + ${PROTEAN_PPOCR_SECONDS:-900} ))
limit() { local l=$(( BUDGET_END - SECONDS )); [ $l -gt $1 ] && l=$1; [ $l -lt 5 ] && l=5; echo $l; }
{ nvidia-smi -L 2>/dev/null; uptime; nproc; (cd "$SRC" && cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null); } > "$OUT/env.txt" 2>&1
sweep() { local s; s=$(echo "$1" | tr ' ' '\n' | awk -F x '{print $4}' | paste -sd, -); echo "$s"; }
for b in cuda ort cpu; do  # the GPU and ORT first: the cpu backend's C++ compile is the slow part
  for m in rec det; do
    model="$MODELS/ch_PP-OCRv4_${m}_infer.onnx"
    if [ "$m" = rec ]; then shapes=$REC_SHAPES; else shapes=$DET_SHAPES; fi
    # one sweep over the last dim: x=random:1x3x48x{80,160,...}
    spec="x=random:$(echo "$shapes" | awk '{print $1}' | awk -F x '{print $1"x"$2"x"$3}')x{$(sweep "$shapes")}"
    t0=$SECONDS
    if [ "$b" = ort ]; then
      timeout $(limit 120) python3 "$SRC/bench/gpu/ppocr_ort.py" "$model" "$(echo $shapes | tr ' ' ',')" "$REPEAT" \
        > "$OUT/${m}_ort.json" 2>> "$OUT/ppocr.log"
      log "$m ort rc=$? $((SECONDS - t0)) s"
      continue
    fi
    dev=cpu; [ "$b" = cuda ] && dev=cuda
    mkdir -p "$OUT/${m}_${b}_out"
    rep=$REPEAT; [ "$b" = cpu ] && rep=$(( (REPEAT + 3) / 4 ))
    PROTEAN_LOGS=perf_hints,graph_breaks,recompiles timeout $(limit 150) "$BIN/protean" run "$model" "$spec" --backend $b \
      --device $dev --repeat $rep --warmup 2 --stats-json "$OUT/${m}_${b}.json" --save-outputs "$OUT/${m}_${b}_out" -q \
      >> "$OUT/ppocr.log" 2>&1
    log "$m $b rc=$? $((SECONDS - t0)) s"
  done
done
python3 "$SRC/bench/gpu/ppocr_merge.py" "$OUT" > "$OUT/ppocr_gpu.json" 2>> "$OUT/ppocr.log"
log "merge rc=$?"
