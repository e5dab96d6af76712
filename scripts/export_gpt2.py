#!/usr/bin/env python3
"""Exports GPT-2 small (transformers' GPT2Config() defaults: 12 layers, 12 heads, n_embd 768, vocab
50257; seeded random init, no download) to ONNX with torch's dynamo exporter, the sequence axis
dynamic, opset 18, fp32, weights as external data; and writes what bench/gpu/gpt2_bench.cpp compares
against, all from the same module:

    python3 scripts/export_gpt2.py WORKDIR [LENGTHS]

WORKDIR/gpt2.onnx (+ gpt2.onnx.data), lengths.txt, and per sequence length L (default: the benchmark's
64 128 37 200 256 91 311 512 77 400 150 300): ids_L.npy (seeded int64 token ids [1, L]),
ref_bf16_L.npy (last_hidden_state of model.to(torch.bfloat16) on CUDA, as float32) and ref_f32_L.npy
(the f32 model on CUDA, TF32 off); WORKDIR/gpt2_state.pt (the state dict, for bench/gpu/gpt2_torch.py).
Needs torch, transformers and onnx (the GPU machine has them; CI does not run this).
"""
import json
import os
import sys
import time

import numpy as np
import torch
from transformers import GPT2Config, GPT2Model

DEFAULT_LENGTHS = [64, 128, 37, 200, 256, 91, 311, 512, 77, 400, 150, 300]


class LastHidden(torch.nn.Module):
    """GPT2Model returning only last_hidden_state [1, seq, 768] (no KV cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(use_cache=False)
    return LastHidden(GPT2Model(config)).eval()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    lengths = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else DEFAULT_LENGTHS
    os.makedirs(out, exist_ok=True)
    model = build_model()
    torch.save(model.state_dict(), os.path.join(out, "gpt2_state.pt"))
    t0 = time.time()
    ids = torch.randint(0, 50257, (1, 16), dtype=torch.int64)
    path = os.path.join(out, "gpt2.onnx")
    with torch.no_grad():
        torch.onnx.export(model, (ids,), path, dynamo=True, input_names=["input_ids"],
                          output_names=["last_hidden_state"], dynamic_shapes={"input_ids": {1: torch.export.Dim("seq")}},
                          opset_version=18, external_data=True)
    export_s = time.time() - t0
    g = torch.Generator().manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m32 = model.cuda()
    refs = {}
    with torch.no_grad():
        for L in lengths:
            x = torch.randint(0, 50257, (1, L), generator=g, dtype=torch.int64)
            np.save(os.path.join(out, f"ids_{L}.npy"), x.numpy())
            refs[L] = m32(x.cuda()).float().cpu().numpy()
            np.save(os.path.join(out, f"ref_f32_{L}.npy"), refs[L])
        mbf = m32.to(torch.bfloat16)
        for L in lengths:
            x = torch.from_numpy(np.load(os.path.join(out, f"ids_{L}.npy"))).cuda()
            np.save(os.path.join(out, f"ref_bf16_{L}.npy"), mbf(x).float().cpu().numpy())
    with open(os.path.join(out, "lengths.txt"), "w") as f:
        f.write(" ".join(str(L) for L in lengths) + "\n")
    try:
        import onnx
        m = onnx.load(path, load_external_data=False)
        ops = sorted({(n.domain or "ai.onnx") + ":" + n.op_type for n in m.graph.node})
        n_nodes = len(m.graph.node)
    except ImportError:
        ops, n_nodes = [], -1
    info = {"export_s": round(export_s, 2), "onnx_bytes": os.path.getsize(path),
            "data_bytes": os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0,
            "nodes": n_nodes, "ops": ops, "torch": torch.__version__, "lengths": lengths,
            "params": sum(p.numel() for p in model.parameters())}
    with open(os.path.join(out, "export.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
