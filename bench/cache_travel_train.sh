#!/usr/bin/env bash
# Cold compile against a bundle for the compiled GPT train step (forward, backward and AdamW in one
# frame; bench/train_bench.cpp's child process), each in a fresh artifact cache directory:
#   cold:   an empty PROTEAN_CACHE_DIR, the first step (capture, passes, backend incl. the C++ compiler)
#   bundle: `protean cache export` of that directory, `protean cache import` into a new empty one (timed
#           as a process), then the first step there (no compiler run: the backend phase is milliseconds)
# Usage: bench/cache_travel_train.sh [ROUNDS] > OUT.json   (one JSON object per round, then a summary)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
rows=()
for ((r = 0; r < ROUNDS; r++)); do
  D1=$(mktemp -d); D2=$(mktemp -d); B=$(mktemp -u).bundle
  cold=$(PROTEAN_CACHE_DIR=$D1 OMP_WAIT_POLICY=passive build/train_bench --child gpt protean_compiled 2 1 2>&1 | tail -1)
  PROTEAN_CACHE_DIR=$D1 build/protean cache export "$B" > /dev/null
  t0=$(date +%s%N)
  PROTEAN_CACHE_DIR=$D2 build/protean cache import "$B" > /dev/null
  t1=$(date +%s%N)
  warm=$(PROTEAN_CACHE_DIR=$D2 OMP_WAIT_POLICY=passive build/train_bench --child gpt protean_compiled 2 1 2>&1 | tail -1)
  rows+=("$(python3 - "$cold" "$warm" "$(( (t1 - t0) / 1000 ))" "$(stat -c %s "$B")" <<'PY'
import json, sys
c = json.loads(sys.argv[1][sys.argv[1].index('{'):])
w = json.loads(sys.argv[2][sys.argv[2].index('{'):])
print(json.dumps({"cold_first_step_s": c["first_step_s"], "bundle_first_step_s": w["first_step_s"],
                  "bundle_over_cold": round(w["first_step_s"] / c["first_step_s"], 4),
                  "import_process_ms": int(sys.argv[3]) / 1000, "bundle_bytes": int(sys.argv[4]),
                  "cold_phase_seconds": c["phase_seconds"], "bundle_phase_seconds": w["phase_seconds"]}))
PY
)")
  rm -rf "$D1" "$D2" "$B"
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, statistics, subprocess, sys, os
rows = [json.loads(l) for l in sys.stdin if l.strip()]
def s(k):
    v = [r[k] for r in rows]
    return {"median": statistics.median(v), "worst": max(v), "values": v}
print(json.dumps({"benchmark": "cache travel: compiled GPT train step, cold vs bundle",
                  "command": "bench/cache_travel_train.sh " + str(len(rows)),
                  "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  "load_average": os.getloadavg(),
                  "cold_first_step_s": s("cold_first_step_s"), "bundle_first_step_s": s("bundle_first_step_s"),
                  "bundle_over_cold": s("bundle_over_cold"), "import_process_ms": s("import_process_ms"),
                  "rounds": rows}, indent=1))'
