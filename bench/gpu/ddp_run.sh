#!/usr/bin/env bash
# Data-parallel training on a machine with 2 GPUs (docs/distributed.md, "On GPUs"), from the prebuilt
# tree of bench/gpu/pack.sh: bench/gpu/ddp_run.sh PREBUILT.txz OUT_DIR
#  1. the single-GPU tests of the training step and the NCCL group (protean_cuda_tests);
#  2. NCCL bootstrapped over the store: 2 ranks started by `protean launch`, no MPI;
#  3. examples/ddp_char_gpt on 2 GPUs with per-rank sequence lengths, compiler collectives on and off,
#     every rank's parameters compared after each step (--check-sync);
#  4. equivalence: 2 ranks x batch 4 against 1 rank x batch 8 (same samples, same lengths);
#  5. scaling: 1 rank against 2 ranks at the same per-rank batch (d=128, 4 layers, batch 16 and 64 per
#     rank: SCALE_BATCHES), rounds alternating.
# Each command's output and JSON land in OUT_DIR; bench/gpu/ddp_merge.py OUT_DIR summarizes them.
set -uo pipefail
PRE=${1:?usage: ddp_run.sh PREBUILT.txz OUT_DIR}
OUT=${2:?usage: ddp_run.sh PREBUILT.txz OUT_DIR}
mkdir -p "$OUT"
# NVLink multicast stays off on shared hosts (the machine's own setting; kept for every child).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=$(mktemp -d)
tar xJf "$PRE" -C "$W"
export LD_LIBRARY_PATH=$W/lib PROTEAN_SOURCE_DIR=$PWD
B=$W/bin
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/gpus.txt" 2>&1
if [ -z "${PROTEAN_NCCL_LIBRARY:-}" ]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  [ -n "$nccl_dir" ] && export PROTEAN_NCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2
fi
echo "NCCL: ${PROTEAN_NCCL_LIBRARY:-none}" >> "$OUT/gpus.txt"
export PROTEAN_CACHE_DIR=$(mktemp -d)

timeout 300 "$B/protean_cuda_tests" --gtest_filter='CudaTrainStep*:DistributedNccl*' > "$OUT/tests_1gpu.txt" 2>&1
echo "tests_1gpu rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED" "$OUT/tests_1gpu.txt"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "GPUs: $NGPU"
NP=$(( NGPU >= 2 ? 2 : 1 ))  # NCCL takes one rank per GPU: on one GPU only the 1-rank runs
timeout 120 "$B/protean" launch --nproc "$NP" -- "$B/protean_launch_rank_program" nccl > "$OUT/launch_nccl.txt" 2>&1
echo "launch_nccl rc=$?"; tail -3 "$OUT/launch_nccl.txt"

run() {  # run NPROC NAME ARGS...
  local np=$1 name=$2; shift 2
  timeout 200 "$B/protean" launch --nproc "$np" -- "$B/example_ddp_char_gpt" --device cuda "$@" --json "$OUT/$name.json" \
    > "$OUT/$name.txt" 2>&1
  echo "$name rc=$?"; tail -4 "$OUT/$name.txt"
}
if [ "$NP" = 2 ]; then
  run 2 perrank_collectives --steps 16 --check-sync
  run 2 perrank_no_collectives --steps 16 --check-sync --no-collectives
  run 2 equivalence_2x4 --steps 12 --batch 4 --lengths same --check-sync
fi
run 1 equivalence_1x8 --steps 12 --batch 8 --lengths same
# Scaling at each per-rank batch of SCALE_BATCHES (default 16 and 64: the d=128 step at batch 16 is
# ~1.8 ms, mostly the host's launches; at 64 the GPU's work dominates).
for b in ${SCALE_BATCHES:-16 64}; do
  for r in 1 2 3; do
    run 1 scale_b${b}_1rank_r$r --d 128 --layers 4 --batch "$b" --lengths same --steps 40 --warmup 8
    if [ "$NP" = 2 ]; then run 2 scale_b${b}_2ranks_r$r --d 128 --layers 4 --batch "$b" --lengths same --steps 40 --warmup 8; fi
  done
done
exit 0
