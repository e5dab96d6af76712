#!/usr/bin/env python3
"""Data-parallel training on CPU ranks: steps/s of examples/ddp_char_gpt.cpp with 1 rank and with 2
ranks at the same per-rank batch (weak scaling), runs alternating, each a new mpirun; as a control, two
independent 1-rank jobs at once (the cores shared, no exchange); plus one run with each rank's own
sequence lengths. Each step's time is the slowest rank's; steps/s counts the steps after
the warm-up (the first compiles). Medians with the worst case.

  python3 bench/distributed_cpu.py [--build build] [--runs 3] [--steps 14] [--backend cpu] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time


def run(build, np, args, extra):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1", PROTEAN_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PROTEAN_COLLECTIVES_TIMEOUT_S="900")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np), os.path.join(build, "example_ddp_char_gpt"),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch), "--backend", args.backend,
           "--json", path] + extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    r = json.load(open(path))
    os.unlink(path)
    r["wall_s"] = time.time() - t0
    r["median_step_ms_after_warmup"] = statistics.median(r["step_ms_max_over_ranks"][args.warmup:])
    r["command"] = " ".join(cmd[:5] + ["build/example_ddp_char_gpt"] + cmd[6:-2])
    return r


def run_two_single(build, args):
    """Two independent 1-rank jobs at once (no exchange): what sharing the cores alone costs."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(run, build, 1, args, ["--lengths", "same"]) for _ in range(2)]
        rs = [f.result() for f in futs]
    return {"steps_per_s_each": [r["steps_per_s"] for r in rs],
            "slower_steps_per_s": min(r["steps_per_s"] for r in rs),
            "median_step_ms_after_warmup": [r["median_step_ms_after_warmup"] for r in rs]}


def summary(values):
    return {"median": statistics.median(values), "worst": min(values), "n": len(values), "values": values}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--out", default="bench/results/distributed_cpu_2026-12-02.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    # A first 2-rank run fills the kernel cache (both frames), so the timed runs load compiled kernels.
    warm = run(args.build, 2, args, ["--lengths", "same"])
    one, two, pairs = [], [], []
    for _ in range(args.runs):
        one.append(run(args.build, 1, args, ["--lengths", "same"]))
        two.append(run(args.build, 2, args, ["--lengths", "same"]))
        pairs.append(run_two_single(args.build, args))
    per_rank = run(args.build, 2, args, ["--lengths", "per-rank"])
    s1 = summary([r["steps_per_s"] for r in one])
    s2 = summary([r["steps_per_s"] for r in two])
    m1 = [r["median_step_ms_after_warmup"] for r in one]
    m2 = [r["median_step_ms_after_warmup"] for r in two]
    step_ms = {"one_rank": {"median": statistics.median(m1), "worst": max(m1), "values": m1},
               "two_ranks": {"median": statistics.median(m2), "worst": max(m2), "values": m2}}
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    out = {
        "context": {
            "date": "2026-12-02",
            "machine": f"{cpu} ({os.cpu_count()} vCPUs), shared with other builds and benchmarks while measuring",
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "model": "examples/char_gpt.h: d=32, 4 heads, 1 block, vocab 64, AdamW; interp/cpu backend, 1 thread per rank",
            "backend": args.backend,
            "note": "2 ranks on 2 vCPUs that ~7 other processes also use (load average above): the ranks compete for "
                    "cores with each other and with the rest of the machine, so this records the mechanics (exchange "
                    "cost, compile counts), not the scaling a machine with a core per rank would give.",
        },
        "first_run_compiles_2_ranks": {"wall_s": warm["wall_s"], "first_step_ms": warm["step_ms_max_over_ranks"][0],
                                       "backward_compiles_rank0": warm["backward_compiles_rank0"]},
        "one_rank_steps_per_s": s1,
        "two_ranks_steps_per_s": s2,
        "two_over_one_median": s2["median"] / s1["median"],
        "median_step_ms_slowest_rank": step_ms,
        "samples_per_s_two_over_one_median": 2 * s2["median"] / s1["median"],
        "two_independent_one_rank_jobs_at_once_slower_steps_per_s": summary([p["slower_steps_per_s"] for p in pairs]),
        "runs_two_independent_one_rank_jobs": pairs,
        "runs_one_rank": one,
        "runs_two_ranks": two,
        "two_ranks_own_lengths": per_rank,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("one_rank_steps_per_s", "two_ranks_steps_per_s", "two_over_one_median",
                                          "samples_per_s_two_over_one_median",
                                          "two_independent_one_rank_jobs_at_once_slower_steps_per_s",
                                          "median_step_ms_slowest_rank")}, indent=1))


if __name__ == "__main__":
    main()
