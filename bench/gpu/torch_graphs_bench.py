"""PyTorch's side of `protean_cuda_bench --graphs` (bench/gpu/graphs.sh): the same small function
(x*2+1, row softmax, residual) over [n, 256] f32 at the same sizes in the same order, with
torch.compile mode="reduce-overhead" (dynamic=True, as the Protean side) and default mode: first-call
time per size (a new size records a new CUDA graph under reduce-overhead) and host time of a steady
call (median and worst over 2000 calls, synchronised every 50, no synchronisation per call). Prints
one JSON object."""
import json
import statistics
import time

import torch


def small_fn(x):
    return torch.softmax(x * 2.0 + 1.0, dim=-1) + x


def run(mode):
    torch._dynamo.reset()
    f = torch.compile(small_fn, mode=mode, dynamic=True)
    rows = []
    for n in (64, 128, 37, 200, 256, 91, 311, 512, 77, 400, 150, 300):
        torch.manual_seed(n)
        x = torch.randn(n, 256, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f(x)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(50):
            f(x)
        torch.cuda.synchronize()
        us = []
        for i in range(2000):
            t1 = time.perf_counter()
            f(x)
            us.append((time.perf_counter() - t1) * 1e6)
            if i % 50 == 49:
                torch.cuda.synchronize()
        us.sort()
        rows.append({"n": n, "first_call_ms": round(first_ms, 3), "host_us_median": round(statistics.median(us), 2),
                     "host_us_worst": round(us[-1], 2)})
    return rows


def main():
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for mode in ("default", "reduce-overhead"):
        try:
            out[mode] = {"sizes": run(mode)}
        except Exception as e:  # keep the other mode's figures
            out[mode] = {"error": repr(e)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
