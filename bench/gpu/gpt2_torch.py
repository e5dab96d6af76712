#!/usr/bin/env python3
"""PyTorch's side of bench/gpu/gpt2_run.sh: GPT-2 small, bf16, on CUDA, the same weights as the ONNX
file Protean runs (WORKDIR/gpt2_state.pt from scripts/export_gpt2.py).

    python3 bench/gpu/gpt2_torch.py WORKDIR LABEL [--first-only] [--reduce-overhead]

Prints one JSON object. eager: steady latency per length. compile (torch.compile, default mode,
default dynamic): time from the first call to the last of the first results over the lengths of
WORKDIR/lengths.txt in order (cold when TORCHINDUCTOR_CACHE_DIR is empty), Dynamo's frame and graph
counts, the largest difference from eager, and (unless --first-only) steady latency per length.
Latency: wall time of one call including torch.cuda.synchronize(), median and worst of 30 calls after
5 warm-up calls, as protean_gpt2_bench measures it.
--reduce-overhead: torch.compile(mode="reduce-overhead") only (no eager, no default mode): first
results, CUDA graphs recorded over the 12 lengths (CUDAGraph.capture_begin calls, counted), steady
latency per length, and the first call of 4 new lengths (45, 100, 250, 480) against their steady
latency, as protean_gpt2_bench --mode=reduce-overhead measures them.
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch._dynamo
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from export_gpt2 import build_model  # noqa: E402


def steady(fn, x, reps=30, warmup=5):
    ms = []
    for k in range(warmup + reps):
        t = time.perf_counter()
        fn(x)
        torch.cuda.synchronize()
        if k >= warmup:
            ms.append((time.perf_counter() - t) * 1e3)
    ms.sort()
    return {"median": round(ms[len(ms) // 2], 4), "worst": round(ms[-1], 4), "calls": len(ms)}


def reduce_overhead(model, lengths, ids, eager_out):
    captures = [0]
    orig = torch.cuda.CUDAGraph.capture_begin

    def counted(self, *a, **k):
        captures[0] += 1
        return orig(self, *a, **k)

    torch.cuda.CUDAGraph.capture_begin = counted
    torch._dynamo.reset()
    counters.clear()
    cm = torch.compile(model, mode="reduce-overhead")
    t0 = time.perf_counter()
    first, outs = [], []
    for x in ids:
        t = time.perf_counter()
        outs.append(cm(x).float().cpu())
        first.append(round(time.perf_counter() - t, 4))
    c = {"first_results_s": round(time.perf_counter() - t0, 3), "first_call_s": first,
         "frames_ok": int(counters["frames"]["ok"]), "unique_graphs": int(counters["stats"]["unique_graphs"]),
         "max_abs_vs_eager": float(max((o - e.float().cpu()).abs().max() for o, e in zip(outs, eager_out)))}
    c["steady"] = {str(L): steady(cm, x) for L, x in zip(lengths, ids)}
    c["cuda_graphs_recorded_12_lengths"] = captures[0]
    print(json.dumps({"partial": True, "compile_reduce_overhead": c}), flush=True)  # if the rest is cut short
    fresh = []
    for L in (45, 100, 250, 480):
        torch.manual_seed(L)
        x = torch.randint(0, 50257, (1, L), device="cuda")
        torch.cuda.synchronize()
        before = captures[0]
        t = time.perf_counter()
        cm(x)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t) * 1e3
        st = steady(cm, x, reps=20, warmup=5)
        fresh.append({"seq": L, "first_call_ms": round(first_ms, 4), "steady_median_ms": st["median"],
                      "first_call_extra_ms": round(first_ms - st["median"], 4), "graphs_recorded": captures[0] - before})
    c["new_lengths"] = fresh
    c["cuda_graphs_recorded"] = captures[0]
    torch.cuda.CUDAGraph.capture_begin = orig
    return c


def main():
    work, label = sys.argv[1], sys.argv[2]
    first_only = "--first-only" in sys.argv
    lengths = [int(x) for x in open(os.path.join(work, "lengths.txt")).read().split()]
    model = build_model()
    model.load_state_dict(torch.load(os.path.join(work, "gpt2_state.pt")))
    model = model.to(torch.bfloat16).cuda().eval()
    ids = [torch.from_numpy(np.load(os.path.join(work, f"ids_{L}.npy"))).cuda() for L in lengths]
    res = {"label": label, "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    torch.set_grad_enabled(False)
    eager_out = [model(x) for x in ids]
    torch.cuda.synchronize()
    if "--reduce-overhead" in sys.argv:
        res["compile_reduce_overhead"] = reduce_overhead(model, lengths, ids, eager_out)
        print(json.dumps(res))
        return
    if not first_only:
        res["eager"] = {str(L): steady(model, x) for L, x in zip(lengths, ids)}
    torch._dynamo.reset()
    counters.clear()
    cm = torch.compile(model)
    t0 = time.perf_counter()
    first, outs = [], []
    for x in ids:
        t = time.perf_counter()
        outs.append(cm(x).float().cpu())
        first.append(round(time.perf_counter() - t, 4))
    c = {"first_results_s": round(time.perf_counter() - t0, 3), "first_call_s": first,
         "frames_ok": int(counters["frames"]["ok"]), "unique_graphs": int(counters["stats"]["unique_graphs"]),
         "max_abs_vs_eager": float(max((o - e.float().cpu()).abs().max() for o, e in zip(outs, eager_out)))}
    if not first_only:
        c["steady"] = {str(L): steady(cm, x) for L, x in zip(lengths, ids)}
    res["compile_default"] = c
    print(json.dumps(res))


if __name__ == "__main__":
    main()
