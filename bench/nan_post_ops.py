#!/usr/bin/env python3
"""Cost of keeping NaN through fused relu post-ops (issue 25 item 2), on models with conv + relu layers.

Since relu (and clamp, hardsigmoid) map NaN to 0 inside oneDNN, a fused call whose post-op list holds
one runs the list as a separate pass over the output (ops/post_ops.h) instead of inside the oneDNN
primitive. The peer measured in the same run is the old behaviour, relu handed to oneDNN
(PROTEAN_DNNL_NAN_UNSAFE_POST_OPS=1, a measuring switch only: NaN becomes 0 there).

Each sample is one `protean run MODEL --backend cpu --threads 1 --warmup W --repeat R` process; the
two settings alternate (pairs), so both see the same machine load. Reported per model: the median
call latency of each process, then the median (and worst) over processes, and the median of the
per-pair ratios after/before.

Usage: bench/nan_post_ops.py [--build build] [--pairs 6] [--out bench/results/nan_post_ops_DATE.json]
"""
import argparse, datetime, json, os, statistics, subprocess, tempfile

MODELS = [
    ("ch_ppocr_mobile_v2.0_cls_infer.onnx", "x=random:1x3x48x192"),
    ("ch_PP-OCRv4_det_infer.onnx", "x=random:1x3x320x320"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/protean/models"))
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=f"bench/results/nan_post_ops_{datetime.date.today()}.json")
    a = ap.parse_args()
    protean = os.path.abspath(os.path.join(a.build, "protean"))
    work = tempfile.mkdtemp(prefix="protean-nan-bench-")
    load_start = os.getloadavg()
    base = dict(os.environ, PROTEAN_CACHE_DIR=os.path.join(work, "cache"))
    base.pop("PROTEAN_DNNL_NAN_UNSAFE_POST_OPS", None)

    def run(model, inp, unsafe):
        env = dict(base)
        if unsafe:
            env["PROTEAN_DNNL_NAN_UNSAFE_POST_OPS"] = "1"
        stats = os.path.join(work, "s.json")
        subprocess.run([protean, "run", os.path.join(a.models, model), inp, "--backend", "cpu", "--threads", "1",
                        "--warmup", str(a.warmup), "--repeat", str(a.repeat), "-q", "--stats-json", stats],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        j = json.load(open(stats))
        lat = j["calls"][0]["latencies_ms"][a.warmup:] if len(j["calls"][0]["latencies_ms"]) > a.warmup else j["calls"][0]["latencies_ms"]
        return {"median_ms": statistics.median(lat), "dnnl": j.get("dnnl", {})}

    out = {}
    for model, inp in MODELS:
        run(model, inp, False)  # compile once (cache warm for both settings)
        before, after = [], []
        for i in range(a.pairs):
            order = [True, False] if i % 2 == 0 else [False, True]
            for unsafe in order:
                (before if unsafe else after).append(run(model, inp, unsafe))
        b = [r["median_ms"] for r in before]
        f = [r["median_ms"] for r in after]
        out[model] = {
            "input": inp,
            "before_relu_in_onednn_ms": {"median": statistics.median(b), "worst": max(b), "values": b},
            "after_nan_keeping_pass_ms": {"median": statistics.median(f), "worst": max(f), "values": f},
            "ratio_after_over_before": {"median": statistics.median(x / y for x, y in zip(f, b)),
                                        "worst": max(x / y for x, y in zip(f, b))},
            "dnnl_stats_after": after[-1]["dnnl"],
            "dnnl_stats_before": before[-1]["dnnl"],
        }
        print(model, "before", statistics.median(b), "after", statistics.median(f), "ratio",
              out[model]["ratio_after_over_before"]["median"])
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    result = {
        "context": {
            "date": str(datetime.date.today()), "machine": f"{cpu} ({os.cpu_count()} vCPUs), shared with other jobs",
            "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "command": f"protean run MODEL INPUT --backend cpu --threads 1 --warmup {a.warmup} --repeat {a.repeat}, "
                       f"{a.pairs} alternating pairs; before = PROTEAN_DNNL_NAN_UNSAFE_POST_OPS=1",
        },
        "models": out,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
