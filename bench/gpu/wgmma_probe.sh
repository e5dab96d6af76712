#!/usr/bin/env bash
# Builds and runs bench/gpu/wgmma_probe.cu on one GPU: bench/gpu/wgmma_probe.sh OUTDIR [M...]
# OUTDIR: wgmma_probe.json (the probe's JSON), build.log.
set -uo pipefail
OUT=${1:?usage: bench/gpu/wgmma_probe.sh OUTDIR [M...]}
shift
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
# WGMMA_PROBE_FLAGS: extra nvcc flags (-DRELEASE_CLUSTER=1: the cluster's barrier arrivals release at
# cluster scope and the producer's waits acquire at cluster scope)
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a ${WGMMA_PROBE_FLAGS:-} "$SRC/bench/gpu/wgmma_probe.cu" \
  -I"$SRC/bench/gpu" -lcublasLt -lcuda -o /tmp/wgmma_probe > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
/tmp/wgmma_probe "${@:-512}" > "$OUT/wgmma_probe.json"
