"""torch's scaled_dot_product_attention (is_causal) on q, k, v [1, 12, L, 64] bf16: the peer of
`protean_cuda_bench --attention`. Kernel time by CUDA events around 20 back-to-back calls, median of
10 batches, per L (the 20 calls replayed from one CUDA graph). Prints one JSON object.

python3 bench/gpu/torch_attention.py [BACKEND...]: each of torch's SDPA backends named (default,
flash, cudnn, efficient, math; `default` lets torch choose), one row per backend; a backend that
refuses these inputs reports its error instead of times."""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
LENGTHS = (37, 64, 128, 256, 400, 512, 1024, 2048, 4096)


def time_backend(name):
    rows = {}
    for L in LENGTHS:
        torch.manual_seed(L)
        q, k, v = (torch.randn(1, 12, L, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))

        def call():
            if name == "default":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            with sdpa_kernel(BACKENDS[name]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        try:
            for _ in range(3):
                y = call()
            torch.cuda.synchronize()
            # 20 calls captured in one CUDA graph: the kernel's time without Python's dispatch
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    y = call()
            g.replay()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a backend refusing the inputs is a result
            rows[str(L)] = {"error": str(e).splitlines()[0][:200]}
            continue
        per = []
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(10):
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            per.append(a.elapsed_time(b) / 20 * 1e3)
        per.sort()
        rows[str(L)] = {"median_us": round(per[len(per) // 2], 2), "worst_us": round(per[-1], 2)}
    return rows


def main():
    names = sys.argv[1:] or ["default"]
    result = {"benchmark": "torch scaled_dot_product_attention is_causal [1, 12, L, 64] bf16",
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "device": torch.cuda.get_device_name()}
    if names == ["default"]:
        result["us"] = time_backend("default")
    else:
        result["us_by_backend"] = {n: time_backend(n) for n in names}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
