#!/usr/bin/env bash
# Configures and builds Protean into build/ (RelWithDebInfo). Extra args go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${PROTEAN_BUILD_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j "$jobs"
