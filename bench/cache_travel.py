#!/usr/bin/env python3
"""Compiled artifacts that travel, measured on PP-OCRv4 rec (cpu backend, 1 thread, portable keys).

Every run is a new `protean run` process with `--warmup 0 --repeat 1`, so the first call's latency is
the time to first result (capture + lowering + codegen + the library from some tier or the compiler +
the first run). Scenarios, all in this one run:
  cold      a fresh PROTEAN_CACHE_DIR, nothing cached (also publishes to the Redis tier)
  warm      the cold run's directory again (the disk tier): the peer a bundle should match
  warm_no_program_cache   the same, with PROTEAN_PROGRAM_CACHE=0 (lowering and codegen run again;
            alternated with `warm`, so the two see the same machine load): the program cache's effect
  warm_no_prewarm   the same, with PROTEAN_CPU_PREWARM=0 (oneDNN primitives built on the calling thread
            only; alternated too): the prewarm thread's effect
  bundle    a fresh directory (one of them a fresh $HOME with no PROTEAN_CACHE_DIR, like a new
            container) + `protean cache import` of the bundle exported from the cold directory
  redis     a fresh directory + PROTEAN_CACHE_REMOTE pointing at the Redis the cold run filled
Reported: medians with the worst case, compiler runs (kernel_cache.misses), kernel hit rate, the CPU time
of the first call (the calling thread's: on an idle machine the first call takes about that long; and the
process's), import
time (in-process, from `protean cache import --json`), and the phase split of the warm compile.

Usage: bench/cache_travel.py [--build build] [--model PATH] [--out bench/results/cache_travel_DATE.json]
"""
import argparse, datetime, json, os, shutil, socket, statistics, subprocess, tempfile, time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def med_worst(xs, worst=max):
    return {"median": statistics.median(xs), "worst": worst(xs), "n": len(xs), "values": xs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/protean/models/ch_PP-OCRv4_rec_infer.onnx"))
    ap.add_argument("--cold", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=f"bench/results/cache_travel_{datetime.date.today()}.json")
    a = ap.parse_args()
    protean = os.path.abspath(os.path.join(a.build, "protean"))
    load_start = os.getloadavg()
    work = tempfile.mkdtemp(prefix="protean-travel-bench-")
    base = dict(os.environ, PROTEAN_CACHE_PORTABLE="1")
    for k in ("PROTEAN_CACHE_DIR", "PROTEAN_CACHE_REMOTE", "PROTEAN_CACHE_SIGNING_KEY"):
        base.pop(k, None)
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", work], stdout=subprocess.DEVNULL)
    remote = f"redis://127.0.0.1:{port}/bench"
    counter = [0]

    def fresh(name):
        counter[0] += 1
        d = os.path.join(work, f"{name}{counter[0]}")
        os.makedirs(d)
        return d

    def run(env):
        stats = os.path.join(work, f"stats{counter[0]}-{time.monotonic_ns()}.json")
        t0 = time.monotonic()
        subprocess.run([protean, "run", a.model, "x=random:1x3x48x320", "--backend", "cpu", "--threads", "1",
                        "--warmup", "0", "--repeat", "1", "-q", "--stats-json", stats], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        wall = (time.monotonic() - t0) * 1e3
        j = json.load(open(stats))
        kc = j["kernel_cache"]
        hits = kc["memory_hits"] + kc["disk_hits"] + kc["remote_hits"]
        c = j["calls"][0]
        return {"first_result_ms": c["latencies_ms"][0], "process_wall_ms": wall,
                "first_result_process_cpu_ms": c.get("cpu_ms", [None])[0],
                "first_result_thread_cpu_ms": c.get("thread_cpu_ms", [None])[0],
                "dnnl": j.get("dnnl", {}),
                "compiler_runs": kc["misses"], "kernel_hits": hits,
                "program_cache": j.get("program_cache", {}),
                "kernel_hit_rate": hits / max(1, hits + kc["misses"]), "kernel_cache": kc,
                "phase_seconds": j["stats"].get("phase_seconds", {})}

    def cli(env, *args):
        out = subprocess.run([protean, "cache", *args], env=env, check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        cold, warm, warm_off, warm_noprewarm, bundle, imports, redis_runs = [], [], [], [], [], [], []
        cold_dir = fresh("cold")
        cold.append(run(dict(base, PROTEAN_CACHE_DIR=cold_dir, PROTEAN_CACHE_REMOTE=remote)))
        for _ in range(a.cold - 1):
            cold.append(run(dict(base, PROTEAN_CACHE_DIR=fresh("cold"))))
        for _ in range(a.runs):
            warm.append(run(dict(base, PROTEAN_CACHE_DIR=cold_dir)))
            warm_off.append(run(dict(base, PROTEAN_CACHE_DIR=cold_dir, PROTEAN_PROGRAM_CACHE="0")))
            warm_noprewarm.append(run(dict(base, PROTEAN_CACHE_DIR=cold_dir, PROTEAN_CPU_PREWARM="0")))
        path = os.path.join(work, "rec.bundle")
        exported = cli(dict(base, PROTEAN_CACHE_DIR=cold_dir), "export", path, "--json")
        for i in range(a.runs):
            if i == 0:  # a clean container-like home: no PROTEAN_CACHE_DIR, an empty $HOME
                env = dict(base, HOME=fresh("home"))
            else:
                env = dict(base, PROTEAN_CACHE_DIR=fresh("bundle"))
            t0 = time.monotonic()
            imp = cli(env, "import", path, "--json")
            imports.append({"in_process_ms": imp["seconds"] * 1e3, "process_wall_ms": (time.monotonic() - t0) * 1e3,
                            "kernels": imp["kernels"], "rebuilt": imp["kernels_rebuilt"],
                            "programs": imp.get("programs", 0)})
            bundle.append(run(env))
        for _ in range(a.runs):
            redis_runs.append(run(dict(base, PROTEAN_CACHE_DIR=fresh("redis"), PROTEAN_CACHE_REMOTE=remote)))
    finally:
        redis.kill()
        redis.wait()

    def summary(rs):
        return {"first_result_ms": med_worst([r["first_result_ms"] for r in rs]),
                "process_wall_ms": med_worst([r["process_wall_ms"] for r in rs]),
                "compiler_runs": med_worst([r["compiler_runs"] for r in rs]),
                "kernel_hit_rate": med_worst([r["kernel_hit_rate"] for r in rs], worst=min),
                "first_result_thread_cpu_ms": med_worst([r["first_result_thread_cpu_ms"] for r in rs]),
                "first_result_process_cpu_ms": med_worst([r["first_result_process_cpu_ms"] for r in rs]),
                "program_cache_hits": [r["program_cache"].get("hits", 0) for r in rs],
                "program_cache_remote_hits": [r["program_cache"].get("remote_hits", 0) for r in rs],
                "backend_phase_ms": med_worst([r["phase_seconds"].get("backend", 0) * 1e3 for r in rs])}

    cold_med = statistics.median(r["first_result_ms"] for r in cold)
    b_first = [r["first_result_ms"] for r in bundle]
    r_first = [r["first_result_ms"] for r in redis_runs]
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    result = {
        "context": {
            "date": str(datetime.date.today()),
            "machine": f"{cpu} ({os.cpu_count()} vCPUs)",
            "load_average": os.getloadavg(),
            "load_average_at_start": load_start,
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "model": os.path.basename(a.model),
            "command": "protean run MODEL x=random:1x3x48x320 --backend cpu --threads 1 --warmup 0 --repeat 1 "
                       "(each a new process), PROTEAN_CACHE_PORTABLE=1",
            "target": exported["header"]["target"],
        },
        "bundle_file": {"bytes": exported["file_bytes"], "kernels": exported["kernels"],
                        "export_ms": exported["seconds"] * 1e3},
        "cold": summary(cold),
        "warm_same_dir": summary(warm),
        "warm_same_dir_no_program_cache": summary(warm_off),
        "warm_same_dir_no_prewarm": summary(warm_noprewarm),
        "bundle_fresh_dir": summary(bundle),
        "import": {"in_process_ms": med_worst([i["in_process_ms"] for i in imports]),
                   "process_wall_ms": med_worst([i["process_wall_ms"] for i in imports]),
                   "kernels_written": [i["kernels"] for i in imports], "rebuilt": [i["rebuilt"] for i in imports],
                   "programs_written": [i["programs"] for i in imports]},
        "redis_second_process": summary(redis_runs),
        "targets": {
            "bundle_first_result_le_300ms": statistics.median(b_first) <= 300,
            "bundle_first_result_ratio_to_cold": {"median": statistics.median(b_first) / cold_med,
                                                  "worst": max(b_first) / cold_med},
            "bundle_compiler_runs_zero": all(r["compiler_runs"] == 0 for r in bundle),
            "import_le_50ms": statistics.median(i["in_process_ms"] for i in imports) <= 50,
            "bundle_kernel_hits_100pct": all(r["kernel_hit_rate"] == 1.0 for r in bundle),
            "bundle_program_hits_all": all(r["program_cache"].get("hits", 0) >= 1 for r in bundle),
            "redis_kernel_hits_100pct": all(r["kernel_hit_rate"] == 1.0 for r in redis_runs),
            "redis_program_hits_all": all(r["program_cache"].get("hits", 0) >= 1 for r in redis_runs),
            "redis_first_result_ratio_to_cold": statistics.median(r_first) / cold_med,
        },
        "warm_phase_seconds_first_run": warm[0]["phase_seconds"],
        "runs": {"cold": cold, "warm": warm, "warm_no_program_cache": warm_off, "warm_no_prewarm": warm_noprewarm, "bundle": bundle, "redis": redis_runs, "imports": imports},
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("bundle_file", "targets")}, indent=1))
    print("cold", result["cold"]["first_result_ms"]["median"], "warm", result["warm_same_dir"]["first_result_ms"]["median"],
          "warm without program cache", result["warm_same_dir_no_program_cache"]["first_result_ms"]["median"],
          "warm without prewarm", result["warm_same_dir_no_prewarm"]["first_result_ms"]["median"],
          "warm thread cpu", result["warm_same_dir"]["first_result_thread_cpu_ms"]["median"],
          "bundle", result["bundle_fresh_dir"]["first_result_ms"]["median"], "redis",
          result["redis_second_process"]["first_result_ms"]["median"], "import ms",
          result["import"]["in_process_ms"]["median"])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
