"""PyTorch's side of `protean_cuda_bench --autotune`: LayerNorm+GELU and softmax over 8192 rows of
1024, 2048, 4096 and 8192 bf16 columns, torch.compile mode="max-autotune" with dynamic=False (one
compile, and its tuning, per size) and dynamic=True (one graph for every size after the first), and
the default mode with dynamic=True as the untuned reference; `--no-cudagraphs` runs
"max-autotune-no-cudagraphs" per size instead (the kernels without the graphs' input copies);
`--cols 128,256,512,768` sets the column counts (the narrow sweep of `protean_cuda_bench --autotune`),
`--rows 32 --cols 16384,32768,65536` the few-rows sweep. Per size: the first call's wall time
(compile and tuning included) and the call's GPU time from CUDA events around batches of 20
back-to-back calls (median and worst of 10 batches). Prints one JSON object."""
import json
import sys
import time

import torch
import torch.nn.functional as F

from torch_bench import event_time  # the same event timing as the kernel rows of bench/gpu/run.sh

ROWS = 8192
COLS = [1024, 2048, 4096, 8192]


def ln_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def softmax(x, w, b):
    return torch.softmax(x, -1)


def run(fn, mode, dynamic):
    torch._dynamo.reset()
    kwargs = {"dynamic": dynamic}
    if mode != "default":
        kwargs["mode"] = mode
    compiled = torch.compile(fn, **kwargs)
    rows = []
    for n in COLS:
        torch.manual_seed(n)
        x = torch.randn(ROWS, n, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = compiled(x, w, b)
        torch.cuda.synchronize()
        first_ms = 1e3 * (time.perf_counter() - t0)
        ref = fn(x.float(), w.float(), b.float())
        err = (y.float() - ref).abs().max().item()
        t = event_time(lambda: compiled(x, w, b))
        med, worst = t["median_ms"], t["worst_ms"]
        nbytes = 2.0 * ROWS * n * 2
        rows.append({"cols": n, "first_call_ms": round(first_ms, 1), "call_ms": round(med, 5),
                     "call_worst_ms": round(worst, 5), "gb_per_s": round(nbytes / (med * 1e-3) / 1e9, 1),
                     "max_abs_err_vs_f32_eager": round(err, 4)})
    return rows


def main():
    global COLS, ROWS
    if "--rows" in sys.argv:
        ROWS = int(sys.argv[sys.argv.index("--rows") + 1])
    if "--cols" in sys.argv:
        COLS = [int(c) for c in sys.argv[sys.argv.index("--cols") + 1].split(",")]
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": ROWS, "cols": COLS}
    for name, fn in (("layernorm_gelu", ln_gelu), ("softmax", softmax)):
        case = {}
        modes = (("max-autotune static", "max-autotune", False),
                 ("max-autotune dynamic", "max-autotune", True),
                 ("default dynamic", "default", True))
        if "--no-cudagraphs" in sys.argv:
            modes = (("max-autotune-no-cudagraphs static", "max-autotune-no-cudagraphs", False),)
        for label, mode, dynamic in modes:
            try:
                case[label] = run(fn, mode, dynamic)
            except Exception as e:  # a failing mode is recorded, the others still run
                case[label] = {"error": f"{type(e).__name__}: {e}"[:400]}
        out[f"{name}_{ROWS}_rows_bf16"] = case
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
