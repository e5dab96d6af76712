#!/usr/bin/env bash
# Kernel replay: compiles a fixed corpus on the cpu backend and writes every generated kernel under a
# stable name (src/backend/cpu/kernel_dump.h), so that a refactor of the loop stage or of codegen can
# be checked kernel by kernel against the build before it.
#
#   scripts/kernel_replay.sh dump DIR [BUILD_DIR]   compile the corpus with BUILD_DIR's binaries (default
#                                                   build/), kernels into DIR (emptied first)
#   scripts/kernel_replay.sh diff A B               compare two dumps: files only in A, only in B, and a
#                                                   unified diff of each file that differs; exit 1 if any
#
# The corpus: the compile-behaviour scenarios on the cpu backend, the cpu unit tests (goldens, vector
# forms, post-op fusion, conv layouts, the random differential programs), and the real models through
# `protean run` (PP-OCRv4 rec at three widths, det, cls, Silero VAD) when ~/.cache/protean/models has
# them. The artifact cache lives in $PROTEAN_REPLAY_CACHE (default ~/.cache/protean/replay-cache), so a
# second dump of unchanged kernels compiles nothing. A kernel's file name depends only on the graph the
# backend received (its IR text, constants and size arguments), never on the loop stage or codegen.
# One corpus entry is not deterministic: ScenarioThreads.EightThreadsMixedShapesMatchEager compiles the
# static graph of whichever shape a thread reaches first, so its `mixed-*` file may be named (and sized)
# differently in two dumps of the same build.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

cmd_dump() {
  local dir=$1 build=${2:-build}
  [[ -x $build/protean && -x $build/protean_scenario_tests && -x $build/protean_unit_tests ]] ||
    { echo "kernel_replay: $build has no protean, protean_scenario_tests or protean_unit_tests" >&2; exit 2; }
  rm -rf "$dir"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local cache=${PROTEAN_REPLAY_CACHE:-$HOME/.cache/protean/replay-cache}
  mkdir -p "$cache"
  local log=$dir/.replay.log
  export PROTEAN_KERNEL_DUMP_DIR=$dir PROTEAN_CACHE_DIR=$cache
  unset PROTEAN_LOGS PROTEAN_TRACE PROTEAN_JOB_ID
  echo "kernel_replay: scenarios (cpu)" >&2
  PROTEAN_SCENARIO_BACKEND=cpu "$build/protean_scenario_tests" >>"$log" 2>&1 ||
    { echo "kernel_replay: scenarios failed (see $log)" >&2; exit 1; }
  echo "kernel_replay: cpu unit tests" >&2
  "$build/protean_unit_tests" \
    --gtest_filter='CpuBackend.*:CpuGolden.*:CpuVectorForm.*:CpuDifferential.*:PostOpFusion.*:PostOps.*:ConvLayout.*' \
    >>"$log" 2>&1 || { echo "kernel_replay: unit tests failed (see $log)" >&2; exit 1; }
  local m=$HOME/.cache/protean/models
  if [[ -f $m/ch_PP-OCRv4_rec_infer.onnx ]]; then
    echo "kernel_replay: models" >&2
    local runs=(
      "$m/ch_PP-OCRv4_rec_infer.onnx x=random:1x3x48x{160,320,480}"
      "$m/ch_PP-OCRv4_det_infer.onnx x=random:1x3x96x{96,160}"
      "$m/ch_ppocr_mobile_v2.0_cls_infer.onnx x=random:1x3x48x192"
      "$m/silero_vad_v5.onnx input=random:1x512 state=random:2x1x128 sr=scalar:16000"
    )
    for r in "${runs[@]}"; do
      # shellcheck disable=SC2086  # one string per run: model and inputs
      "$build/protean" run $r --backend cpu >>"$log" 2>&1 || { echo "kernel_replay: protean run $r failed (see $log)" >&2; exit 1; }
    done
  else
    echo "kernel_replay: no models in $m (scripts/fetch_models.sh): models skipped" >&2
  fi
  echo "kernel_replay: $(find "$dir" -name '*.cpp' | wc -l) kernel files in $dir" >&2
}

cmd_diff() {
  local a=$1 b=$2 status=0
  [[ -d $a && -d $b ]] || { echo "kernel_replay: diff needs two dump directories" >&2; exit 2; }
  local only_a only_b common
  only_a=$(comm -23 <(cd "$a" && ls | sort) <(cd "$b" && ls | sort))
  only_b=$(comm -13 <(cd "$a" && ls | sort) <(cd "$b" && ls | sort))
  common=$(comm -12 <(cd "$a" && ls | sort) <(cd "$b" && ls | sort))
  local changed=0 same=0
  for f in $only_a; do echo "only in $a: $f"; status=1; done
  for f in $only_b; do echo "only in $b: $f"; status=1; done
  for f in $common; do
    if cmp -s "$a/$f" "$b/$f"; then
      same=$((same + 1))
    else
      changed=$((changed + 1))
      status=1
      diff -u "$a/$f" "$b/$f" || true
    fi
  done
  echo "kernel_replay: $same identical, $changed changed, $(echo "$only_a" | grep -c . || true) only in $a, $(echo "$only_b" | grep -c . || true) only in $b" >&2
  return $status
}

case ${1:-} in
  dump) [[ $# -ge 2 && $# -le 3 ]] || usage; cmd_dump "$2" "${3:-build}" ;;
  diff) [[ $# -eq 3 ]] || usage; cmd_diff "$2" "$3" ;;
  *) usage ;;
esac
