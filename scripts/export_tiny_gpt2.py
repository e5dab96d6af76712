#!/usr/bin/env python3
"""Exports a tiny seeded GPT-2 (transformers' GPT2Model, 2 layers, n_embd 64, vocab 1000) to ONNX with
torch's default (dynamo) exporter, the sequence length dynamic, opset 18: once self-contained and once
with the weights in an external data file. A development tool for the test models in
tests/data/onnx/ (CI has no PyTorch); run it where torch 2.11, transformers and onnx are installed:

    python3 scripts/export_tiny_gpt2.py OUT_DIR

Writes OUT_DIR/tiny_gpt2.onnx, OUT_DIR/tiny_gpt2_ext.onnx + tiny_gpt2_ext.onnx.data, and prints the
op types, the file sizes and, for several sequence lengths, the largest difference between PyTorch
and ONNX Runtime (when onnxruntime is installed) on seeded random token ids.
"""
import os
import sys

import numpy as np
import onnx
import torch
from transformers import GPT2Config, GPT2Model


class LastHidden(torch.nn.Module):
    """GPT2Model returning only last_hidden_state [1, seq, 64] (no KV cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=128, use_cache=False)
    model = LastHidden(GPT2Model(config)).eval()
    ids = torch.randint(0, 1000, (1, 8), dtype=torch.int64)
    seq = torch.export.Dim("seq")
    paths = {}
    for name, external in (("tiny_gpt2", False), ("tiny_gpt2_ext", True)):
        path = os.path.join(out, name + ".onnx")
        with torch.no_grad():
            torch.onnx.export(model, (ids,), path, dynamo=True, input_names=["input_ids"],
                              output_names=["last_hidden_state"],
                              dynamic_shapes={"input_ids": {1: seq}}, opset_version=18,
                              external_data=external)
        paths[name] = path
        m = onnx.load(path, load_external_data=False)
        n_ext = sum(1 for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
        ops = sorted({(n.domain or "ai.onnx") + ":" + n.op_type for n in m.graph.node})
        print(f"{name}: {os.path.getsize(path)} bytes, ir {m.ir_version}, opsets "
              f"{[(o.domain, o.version) for o in m.opset_import]}, {len(m.functions)} functions, "
              f"{len(m.graph.initializer)} initializers ({n_ext} external)")
        print("  ops:", ", ".join(ops))
        for f in sorted(os.listdir(out)):
            if f.startswith(name + ".onnx."):
                print(f"  {f}: {os.path.getsize(os.path.join(out, f))} bytes")
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: no comparison")
        return
    g = torch.Generator().manual_seed(1)
    for name, path in paths.items():
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        worst = 0.0
        for length in (1, 2, 3, 7, 16, 33, 64, 100, 128):
            x = torch.randint(0, 1000, (1, length), generator=g, dtype=torch.int64)
            with torch.no_grad():
                want = model(x).numpy()
            got = sess.run(None, {"input_ids": x.numpy()})[0]
            worst = max(worst, float(np.max(np.abs(got - want))))
        print(f"{name}: ONNX Runtime {ort.__version__} vs PyTorch {torch.__version__}, seq 1..128: max abs diff {worst:.3g}")


if __name__ == "__main__":
    main()
