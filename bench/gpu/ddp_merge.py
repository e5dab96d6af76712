#!/usr/bin/env python3
"""Summarizes bench/gpu/ddp_run.sh's output folder into one results JSON.

    python3 bench/gpu/ddp_merge.py OUT_DIR RESULT.json --commit SHA --machine TEXT

Scaling: per round, steps/s of 2 ranks over 1 rank (each step's time is the slowest rank's);
equivalence: the largest difference between the 2-rank mean loss and the 1-rank loss per step."""
import argparse, glob, json, os, re, statistics

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("result")
ap.add_argument("--commit", required=True)
ap.add_argument("--machine", required=True)
a = ap.parse_args()

def load(name):
    p = os.path.join(a.out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None

def text(name):
    p = os.path.join(a.out, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""

res = {"machine": a.machine, "commit": a.commit, "command": "bench/gpu/ddp_run.sh PREBUILT OUT; bench/gpu/ddp_merge.py OUT RESULT"}
res["gpus"] = text("gpus.txt")
t = text("tests_1gpu.txt")
res["tests_1gpu"] = {"passed": re.findall(r"\[       OK \] (\S+)", t), "failed": sorted(set(re.findall(r"\[  FAILED  \] (\S+\.\S+)", t))),
                     "skipped": re.findall(r"\[  SKIPPED \] (\S+)", t)}
res["nccl_over_store"] = text("launch_nccl.txt").strip().splitlines()[-4:]
for name in ("perrank_collectives", "perrank_no_collectives"):
    j = load(name)
    if j:
        res[name] = {k: j[k] for k in ("backward_compiles_rank0", "optimizer_compiles_rank0", "parameter_checks_identical",
                                       "steps", "losses", "all_reduce_bytes_per_step")}
        res[name]["compile_lines"] = [l for l in text(name + ".txt").splitlines() if "compiles" in l]
e2, e1 = load("equivalence_2x4"), load("equivalence_1x8")
if e2 and e1:
    d = [abs(x - y) for x, y in zip(e2["losses"], e1["losses"])]
    res["equivalence"] = {"losses_2x4": e2["losses"], "losses_1x8": e1["losses"], "max_abs_diff": max(d),
                          "parameter_checks_identical_2x4": e2["parameter_checks_identical"]}
res["scaling"] = {}
batches = sorted({int(m.group(1)) for m in (re.search(r"scale_b(\d+)_1rank_r\d+\.json", p) for p in glob.glob(os.path.join(a.out, "*.json"))) if m})
for b in batches:
    rounds = []
    for r in sorted({m.group(1) for m in (re.search(rf"scale_b{b}_1rank_r(\d+)\.json", p) for p in glob.glob(os.path.join(a.out, "*.json"))) if m}):
        one, two = load(f"scale_b{b}_1rank_r{r}"), load(f"scale_b{b}_2ranks_r{r}")
        if one and two:
            # throughput: 2 ranks process twice the samples per step
            rounds.append({"round": int(r), "steps_per_s_1rank": one["steps_per_s"], "steps_per_s_2ranks": two["steps_per_s"],
                           "step_ratio": two["steps_per_s"] / one["steps_per_s"],
                           "throughput_ratio": 2 * two["steps_per_s"] / one["steps_per_s"],
                           "median_step_ms_1rank": statistics.median(one["step_ms_max_over_ranks"][one["warmup"]:]),
                           "median_step_ms_2ranks": statistics.median(two["step_ms_max_over_ranks"][two["warmup"]:]),
                           "all_reduce_ms_rank0_2ranks": two["all_reduce_ms_rank0"], "all_reduce_bytes_per_step": two["all_reduce_bytes_per_step"]})
    if rounds:
        res["scaling"][f"batch_{b}"] = {
            "config": f"char GPT d=128, 4 layers, batch {b} per rank, lengths 64..128 (same on every rank), 40 steps after 8 warm-up",
            "rounds": rounds, "throughput_ratio_median": statistics.median(r["throughput_ratio"] for r in rounds),
            "throughput_ratio_worst": min(r["throughput_ratio"] for r in rounds)}
json.dump(res, open(a.result, "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k in ("tests_1gpu", "equivalence", "scaling")}, indent=1)[:3000])
