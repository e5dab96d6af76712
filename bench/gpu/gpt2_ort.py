#!/usr/bin/env python3
"""ONNX Runtime's side of bench/gpu/gpt2_run.sh's CPU check: GPT-2 small (WORKDIR/gpt2.onnx, the
float32 export of scripts/export_gpt2.py) on ONNX Runtime's CPU execution provider.

    python3 bench/gpu/gpt2_ort.py WORKDIR [LENGTHS]

For each sequence length L (default 64,128,37,200,91,256: the benchmark's first lengths, in order)
writes seeded int64 token ids WORKDIR/ort_ids_L.npy [1, L] and ORT's last_hidden_state
WORKDIR/ort_L.npy (float32), and WORKDIR/ort_lengths.txt; bench/gpu/gpt2_cpu_bench.cpp compares
Protean's interp and cpu backends against them. Prints one JSON object: ORT's version, session
creation time and per length the time of one run (median of 3 after the first).
"""
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    work = sys.argv[1]
    lengths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "64,128,37,200,91,256").split(",")]
    t0 = time.perf_counter()
    sess = ort.InferenceSession(os.path.join(work, "gpt2.onnx"), providers=["CPUExecutionProvider"])
    create_s = time.perf_counter() - t0
    name = sess.get_inputs()[0].name
    rng = np.random.default_rng(2)
    rows = []
    for L in lengths:
        ids = rng.integers(0, 50257, size=(1, L), dtype=np.int64)
        np.save(os.path.join(work, f"ort_ids_{L}.npy"), ids)
        out = sess.run(None, {name: ids})[0]
        np.save(os.path.join(work, f"ort_{L}.npy"), out.astype(np.float32))
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            sess.run(None, {name: ids})
            ts.append(time.perf_counter() - t)
        rows.append({"seq": L, "run_s": round(sorted(ts)[1], 4), "shape": list(out.shape)})
    with open(os.path.join(work, "ort_lengths.txt"), "w") as f:
        f.write(" ".join(str(L) for L in lengths) + "\n")
    print(json.dumps({"onnxruntime": ort.__version__, "provider": "CPUExecutionProvider",
                      "session_s": round(create_s, 3), "threads": os.cpu_count(), "lengths": rows}))


if __name__ == "__main__":
    main()
