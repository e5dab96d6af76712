#!/usr/bin/env python3
"""Merges bench/gpu/ppocr_run.sh's per-run files into one JSON (stdout).

    python3 bench/gpu/ppocr_merge.py OUTDIR

OUTDIR holds {rec,det}_{cuda,cpu}.json (`protean run --stats-json`), {rec,det}_ort.json
(ppocr_ort.py), {rec,det}_{cuda,cpu}_out/*.npy (the last shape's outputs of each backend), env.txt.
Per model and shape: median and worst latency of Protean cuda, Protean cpu and ONNX Runtime CPU, the
speed-ups of cuda over each, and the cuda-vs-cpu output difference at the last shape.
"""
import glob
import json
import os
import sys

import numpy as np


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{os.path.basename(path)}: {e}"}


def protean_rows(j):
    rows = {}
    for c in j.get("calls", []):
        lat = c["latencies_ms"]
        rows[c["inputs"][0]] = {"median_ms": c["median_ms"], "worst_ms": max(lat), "calls": len(lat)}
    return rows


def main():
    d = sys.argv[1]
    env = open(os.path.join(d, "env.txt")).read() if os.path.exists(os.path.join(d, "env.txt")) else ""
    out = {"bench": "ppocr_gpu", "env": env, "models": {}}
    for m in ("rec", "det"):
        cu, cp, ort = (load(os.path.join(d, f"{m}_{k}.json")) for k in ("cuda", "cpu", "ort"))
        rc, rp = protean_rows(cu), protean_rows(cp)
        ro = {r["shape"]: r for r in ort.get("shapes", [])}
        shapes = []
        for s in rc.keys() | rp.keys() | ro.keys():
            row = {"shape": s, "protean_cuda": rc.get(s), "protean_cpu": rp.get(s),
                   "ort_cpu": {k: ro[s][k] for k in ("median_ms", "worst_ms", "first_ms")} if s in ro else None}
            if rc.get(s) and rp.get(s):
                row["cuda_vs_protean_cpu"] = rp[s]["median_ms"] / rc[s]["median_ms"]
            if rc.get(s) and s in ro:
                row["cuda_vs_ort_cpu"] = ro[s]["median_ms"] / rc[s]["median_ms"]
            shapes.append(row)
        shapes.sort(key=lambda r: [int(x) for x in r["shape"].split("x")])
        diff = {}
        for a in sorted(glob.glob(os.path.join(d, f"{m}_cuda_out", "*.npy"))):
            b = os.path.join(d, f"{m}_cpu_out", os.path.basename(a))
            if os.path.exists(b):
                x, y = np.load(a).astype(np.float64), np.load(b).astype(np.float64)
                diff[os.path.basename(a)] = {"shape": list(x.shape), "max_abs": float(np.max(np.abs(x - y))),
                                             "max_abs_ref": float(np.max(np.abs(y)))}
        out["models"][m] = {"shapes": shapes, "cuda_vs_cpu_outputs_last_shape": diff,
                            "protean_cuda_stats": cu.get("stats", cu.get("error")),
                            "protean_cpu_stats": cp.get("stats", cp.get("error")),
                            "ort": {k: v for k, v in ort.items() if k != "shapes"}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
