"""torch's scaled_dot_product_attention (is_causal) on q, k, v [1, 12, L, 64] bf16: the peer of
`protean_cuda_bench --attention`. Kernel time by CUDA events around 20 back-to-back calls, median of
10 batches, per L (the 20 calls replayed from one CUDA graph). Prints one JSON object."""
import json

import torch
import torch.nn.functional as F


def main():
    rows = {}
    for L in (37, 128, 256, 400, 512, 1024, 2048, 4096):
        torch.manual_seed(L)
        q, k, v = (torch.randn(1, 12, L, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        for _ in range(3):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        # 20 calls captured in one CUDA graph: the kernel's time without Python's dispatch
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g.replay()
        torch.cuda.synchronize()
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
    print(json.dumps({"benchmark": "torch scaled_dot_product_attention is_causal [1, 12, L, 64] bf16",
                      "torch": torch.__version__, "us": rows}))


if __name__ == "__main__":
    main()
