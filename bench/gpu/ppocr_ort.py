#!/usr/bin/env python3
"""ONNX Runtime's CPU side of bench/gpu/ppocr_run.sh: latency of a PP-OCRv4 model per input shape.

    python3 bench/gpu/ppocr_ort.py MODEL.onnx SHAPES [REPEAT]

SHAPES: comma-separated NxCxHxW (e.g. 1x3x48x80,1x3x48x160). Inputs are uniform in [-1, 1) (seeded), as
`protean run NAME=random:...` makes them. Per shape: one untimed run, 3 warm-up runs, then REPEAT timed
runs (default 20). Prints one JSON object: ORT's version, its session creation time, the execution
provider and threads, and per shape the latencies in ms with their median and worst.
"""
import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    model, shapes = sys.argv[1], [tuple(int(d) for d in s.split("x")) for s in sys.argv[2].split(",")]
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    t0 = time.perf_counter()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    create_s = time.perf_counter() - t0
    name = sess.get_inputs()[0].name
    rng = np.random.default_rng(0)
    rows = []
    for shape in shapes:
        x = (rng.random(shape, dtype=np.float32) * 2 - 1).astype(np.float32)
        t = time.perf_counter()
        sess.run(None, {name: x})
        first_ms = (time.perf_counter() - t) * 1e3
        for _ in range(3):
            sess.run(None, {name: x})
        lat = []
        for _ in range(repeat):
            t = time.perf_counter()
            sess.run(None, {name: x})
            lat.append((time.perf_counter() - t) * 1e3)
        rows.append({"shape": "x".join(map(str, shape)), "first_ms": first_ms, "latencies_ms": lat,
                     "median_ms": statistics.median(lat), "worst_ms": max(lat)})
    print(json.dumps({"onnxruntime": ort.__version__, "provider": "CPUExecutionProvider",
                      "intra_op_threads_default": os.cpu_count(), "session_create_s": create_s,
                      "model": os.path.basename(model), "shapes": rows}))


if __name__ == "__main__":
    main()
