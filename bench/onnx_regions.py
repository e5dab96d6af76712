#!/usr/bin/env python3
"""ONNX models' repeated blocks as regions (LoadOptions::find_regions, CompileOptions::auto_regions):
cold compile, steady latency and outputs, flat (`protean run --no-regions`) against regional, on the
cpu backend with one thread.

Every run is a new `protean run` process. Cold: a fresh PROTEAN_CACHE_DIR, `--warmup 0 --repeat 1`,
so the first call's latency is the time to the first result (capture, passes, lowering, codegen, the
C++ compiler, the first run). Steady: the cold run's directory again, `--warmup 5 --repeat N`, the
median call. Flat and regional runs alternate, so both see the same machine load. Outputs: each
mode's `--save-outputs`, compared element by element (max abs difference).

gpt2_12_layers is tiny GPT-2's layer repeated to 12 layers by bench/deep_gpt2.py (11 hits per
compile). PP-OCRv4 rec and tiny GPT-2 have 2 uses per repeated block, below the default saving (PROTEAN_ONNX_REGION_MIN_SAVED,
200 nodes): the regional runs set it to --min-saved (0), so their blocks are regions.

Usage: bench/onnx_regions.py [--build build] [--cold 3] [--steady 3] [--min-saved 0] [--out bench/results/onnx_regions_DATE.json]
"""
import argparse, datetime, json, os, shutil, statistics, struct, subprocess, tempfile

MODELS = {
    "ppocr_v4_rec": (os.path.expanduser("~/.cache/protean/models/ch_PP-OCRv4_rec_infer.onnx"), "x=random:1x3x48x320"),
    "tiny_gpt2": ("tests/data/onnx/tiny_gpt2.onnx", "input_ids=random:1x64"),
    # bench/deep_gpt2.py OUT --layers 12: tiny GPT-2's layer repeated to 12 layers
    "gpt2_12_layers": (None, "input_ids=random:1x64"),
}


def med_worst(xs):
    return {"median": statistics.median(xs), "worst": max(xs), "n": len(xs), "values": xs}


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    hlen = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + hlen].decode()
    assert "'<f4'" in header, header
    body = data[10 + hlen:]
    return struct.unpack(f"<{len(body) // 4}f", body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--steady", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--models", default=",".join(MODELS))
    # 0: every repeated block of at least LoadOptions::region_min_nodes becomes a region, so these
    # small models (2 uses per block) are measured regional at all; the default (200) keeps them flat.
    ap.add_argument("--min-saved", dest="min_saved", type=int, default=0)
    ap.add_argument("--note", default="", help="written into the JSON (e.g. which commit the binary was built from)")
    ap.add_argument("--out", default=f"bench/results/onnx_regions_{datetime.date.today()}.json")
    a = ap.parse_args()
    protean = os.path.abspath(os.path.join(a.build, "protean"))
    work = tempfile.mkdtemp(prefix="protean-regions-bench-")
    load_start = os.getloadavg()
    base = dict(os.environ)
    base.pop("PROTEAN_CACHE_DIR", None)
    base.pop("PROTEAN_CACHE_REMOTE", None)
    counter = [0]
    results = {}
    for name in a.models.split(","):
        path, spec = MODELS[name]
        if path is None:
            path = os.path.join(work, f"{name}.onnx")
            subprocess.run(["python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "deep_gpt2.py"), path,
                            "--layers", "12"], check=True, stdout=subprocess.DEVNULL)

        def run(mode, cache, warmup, repeat, save=None):
            counter[0] += 1
            stats = os.path.join(work, f"stats{counter[0]}.json")
            cmd = [protean, "run", path, spec, "--backend", "cpu", "--threads", "1", "--seed", "7",
                   "--warmup", str(warmup), "--repeat", str(repeat), "-q", "--stats-json", stats]
            if mode == "flat":
                cmd.append("--no-regions")
            if save:
                os.makedirs(save, exist_ok=True)
                cmd += ["--save-outputs", save]
            env = dict(base, PROTEAN_CACHE_DIR=cache, OMP_NUM_THREADS="1",
                       PROTEAN_ONNX_REGION_MIN_SAVED=str(a.min_saved))
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            with open(stats) as f:
                return json.load(f)

        per = {m: {"cold_first_result_ms": [], "cold_backend_s": [], "steady_median_ms": []} for m in ("flat", "regional")}
        dirs = {}
        regions = None
        for i in range(a.cold):
            for mode in ("flat", "regional") if i % 2 == 0 else ("regional", "flat"):
                d = os.path.join(work, f"{name}_{mode}_{i}")
                s = run(mode, d, 0, 1, save=os.path.join(work, f"out_{name}_{mode}") if i == 0 else None)
                c = s["calls"][0]
                per[mode]["cold_first_result_ms"].append(c["latencies_ms"][0])
                per[mode]["cold_backend_s"].append(s["stats"]["phase_seconds"].get("backend", 0.0))
                per[mode]["region_compiles"] = s["stats"]["region_compiles"]
                per[mode]["region_hits"] = s["stats"]["region_hits"]
                per[mode]["compiles"] = s["stats"]["compiles"]
                dirs[mode] = d
                regions = s.get("regions", regions)
        for i in range(a.steady):
            for mode in ("flat", "regional") if i % 2 == 0 else ("regional", "flat"):
                s = run(mode, dirs[mode], 5, a.repeat)
                per[mode]["steady_median_ms"].append(s["calls"][0]["median_ms"])
        outs = {}
        for mode in ("flat", "regional"):
            d = os.path.join(work, f"out_{name}_{mode}")
            outs[mode] = {f: read_npy(os.path.join(d, f)) for f in sorted(os.listdir(d))}
        diff = 0.0
        for f, v in outs["flat"].items():
            w = outs["regional"][f]
            assert len(v) == len(w)
            diff = max(diff, max(abs(x - y) for x, y in zip(v, w)))
        r = {"model": path if MODELS[name][0] else "bench/deep_gpt2.py --layers 12", "input": spec, "regions": regions, "max_abs_diff_outputs": diff}
        for mode in ("flat", "regional"):
            p = per[mode]
            r[mode] = {"cold_first_result_ms": med_worst(p["cold_first_result_ms"]),
                       "cold_backend_s": med_worst(p["cold_backend_s"]),
                       "steady_median_ms": med_worst(p["steady_median_ms"]),
                       "compiles": p["compiles"], "region_compiles": p["region_compiles"],
                       "region_hits": p["region_hits"]}
        r["cold_ratio_regional_over_flat"] = (r["regional"]["cold_first_result_ms"]["median"] /
                                              r["flat"]["cold_first_result_ms"]["median"])
        r["steady_ratio_regional_over_flat"] = (r["regional"]["steady_median_ms"]["median"] /
                                                r["flat"]["steady_median_ms"]["median"])
        results[name] = r
        print(f"{name}: cold flat {r['flat']['cold_first_result_ms']['median']:.0f} ms, regional "
              f"{r['regional']['cold_first_result_ms']['median']:.0f} ms; steady flat "
              f"{r['flat']['steady_median_ms']['median']:.3f} ms, regional {r['regional']['steady_median_ms']['median']:.3f} ms; "
              f"max abs diff {diff:.3g}; regions {regions}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    doc = {"benchmark": "onnx_regions", "date": str(datetime.date.today()), "commit": commit,
           "machine": {"cpu": cpu, "cores": os.cpu_count(), "shared": True,
                       "load_average_start": load_start, "load_average_end": os.getloadavg()},
           "command": "python3 bench/onnx_regions.py " + " ".join(f"--{k} {v}" for k, v in vars(a).items()),
           "backend": "cpu", "threads": 1, "note": a.note, "models": results}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
