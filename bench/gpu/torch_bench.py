"""PyTorch's side of bench/gpu/run.sh, measured the same way as cuda_bench.cpp: device copy
bandwidth, LayerNorm+GELU 16384x4096 bf16 and softmax 8192x8192 bf16 (eager, torch.compile static,
torch.compile dynamic=True), kernel time from CUDA events around batches of back-to-back calls
(median and worst batch), and the host time of one call of a trivial function (x + 1 on 1024
floats): eager and torch.compile. Prints one JSON object."""
import json
import statistics
import time

import torch
import torch.nn.functional as F


def event_time(call, per_batch=20, batches=10):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    per = []
    for _ in range(batches):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_batch):
            call()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / per_batch)
    per.sort()
    return {"median_ms": per[len(per) // 2], "worst_ms": per[-1]}


def bw(t, nbytes, copy_gbs):
    gbs = nbytes / (t["median_ms"] * 1e-3) / 1e9
    return dict(t, gb_per_s=round(gbs, 1), pct_of_copy=round(100 * gbs / copy_gbs, 1))


def main():
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    n = (1 << 30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    c = event_time(lambda: dst.copy_(src), 5, 10)
    copy_gbs = 2 * (1 << 30) / (c["median_ms"] * 1e-3) / 1e9
    out["copy"] = dict(c, bytes=1 << 30, gb_per_s=round(copy_gbs, 1))
    del src, dst

    torch.manual_seed(0)
    M, N = 16384, 4096
    x = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(N, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, dtype=torch.bfloat16, device="cuda")

    def ln_gelu(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))

    nbytes = 2 * M * N * 2
    row = {"eager": bw(event_time(lambda: ln_gelu(x, w, b)), nbytes, copy_gbs)}
    for name, dyn in (("compile_static", False), ("compile_dynamic", True)):
        torch._dynamo.reset()
        f = torch.compile(ln_gelu, dynamic=dyn)
        t0 = time.perf_counter()
        f(x, w, b)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        row[name] = dict(bw(event_time(lambda: f(x, w, b)), nbytes, copy_gbs), first_call_s=round(first, 3))
    out["layernorm_gelu_16384x4096_bf16"] = row
    del x

    M = N = 8192
    x = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
    sm = lambda x: torch.softmax(x, -1)
    nbytes = 2 * M * N * 2
    row = {"eager": bw(event_time(lambda: sm(x)), nbytes, copy_gbs)}
    for name, dyn in (("compile_static", False), ("compile_dynamic", True)):
        torch._dynamo.reset()
        f = torch.compile(sm, dynamic=dyn)
        f(x)
        row[name] = bw(event_time(lambda: f(x)), nbytes, copy_gbs)
    out["softmax_8192x8192_bf16"] = row
    del x

    x = torch.randn(1024, device="cuda")
    triv = lambda x: x + 1
    host = {}
    for name, f in (("eager", triv), ("compile", torch.compile(triv))):
        for _ in range(100):
            f(x)
        torch.cuda.synchronize()
        us = []
        for i in range(2000):
            t0 = time.perf_counter()
            f(x)
            us.append((time.perf_counter() - t0) * 1e6)
            if i % 50 == 49:
                torch.cuda.synchronize()
        us.sort()
        host[name] = {"median": round(statistics.median(us), 2), "worst": round(us[-1], 2), "calls": len(us)}
    out["host_overhead_trivial_us"] = host
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
