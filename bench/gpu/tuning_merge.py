"""Merges one bench/gpu/tuning_ab.sh OUTDIR into a results JSON: tuning_merge.py OUTDIR OUT_JSON COMMIT [NOTE]"""
import datetime
import json
import os
import sys

from collect_runs import read_run  # a file's one JSON object, else its last line that starts with '{'

d, out, commit = sys.argv[1], sys.argv[2], sys.argv[3]
runs = json.load(open(os.path.join(d, 'gpt2_runs.json')))
logs = {f[:-4]: open(os.path.join(d, f)).read() for f in sorted(os.listdir(d)) if f.endswith('_fresh.log')}
steps = open(os.path.join(d, 'steps.log')).read()
# what each build of tuning_ab.sh is, in the order the description lists them (the first three always)
BUILDS = {
    "ro": "reduce-overhead (ro)",
    "mg": "max-autotune timed in graphs (mg)",
    "mc": "max-autotune timed by stream launches after an L2 flush (mc)",
    "b32": "reduce-overhead with PROTEAN_BUCKETS=pow2=128,step=32 (b32)",
    "m16": "max-autotune over 16 cuBLASLt algorithms, PROTEAN_AUTOTUNE_BLAS_ALGOS=16 (m16)",
    "r2": "reduce-overhead with 2 rows a block in warp-per-row kernels, PROTEAN_CUDA_WARP_ROWS_PER_BLOCK=2 (r2)",
    "m0": "max-autotune without the one-kernel cuBLASLt algorithms, PROTEAN_AUTOTUNE_BLAS_ONE_KERNEL=0 (m0)",
}
ALWAYS = ("ro", "mg", "mc")
res = {
    "benchmark": "GPT-2 small bf16, 12 lengths: " + ", ".join(what for b, what in BUILDS.items() if b in ALWAYS or any(k.startswith(b) for k in runs)) + "; torch.compile reduce-overhead in the same call",
    "command": "ROUNDS=R bench/gpu/tuning_ab.sh OUTDIR",
    "date": datetime.date.today().isoformat(),
    "commit": commit,
    "device": steps.splitlines()[1] if len(steps.splitlines()) > 1 else "",
    "tests": open(os.path.join(d, 'tests.log')).read(),
    "steps_log": steps,
    "tuning_and_new_sizes_logs": logs,
    "torch": read_run(os.path.join(d, 'gpt2_torch.json')),
    "protean_runs": runs,
}
trace = os.path.join(d, 'trace', 'graph_trace.json')  # bench/gpu/graph_trace.sh OUTDIR/trace
if os.path.exists(trace):
    res["graph_trace"] = json.load(open(trace))
if len(sys.argv) > 4:
    res["note"] = sys.argv[4]
json.dump(res, open(out, 'w'))
