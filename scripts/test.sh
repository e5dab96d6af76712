#!/usr/bin/env bash
# Runs every test suite (unit, golden, scenario, e2e, install) with ctest; prints ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j "${PROTEAN_TEST_JOBS:-$(nproc)}" "$@"
