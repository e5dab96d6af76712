#!/usr/bin/env bash
# Runs every test suite (unit, golden, scenario, e2e, install, fuzz replays) with ctest and prints
# ctest's summary, then a short run of the libFuzzer targets (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j "${PROTEAN_TEST_JOBS:-$(nproc)}" "$@"
# A short libFuzzer run of every fuzz target (a few seconds each; scripts/fuzz.sh documents the long
# run). PROTEAN_SKIP_FUZZ=1 skips it (e.g. on a machine without clang).
if [ "${PROTEAN_SKIP_FUZZ:-0}" != 1 ] && [ $# -eq 0 ]; then scripts/fuzz.sh; fi
