#!/usr/bin/env python3
"""A deeper GPT-2 for bench/onnx_regions.py, built from the 2-layer tests/data/onnx/tiny_gpt2.onnx
without torch or the onnx Python package: the model is decoded to protobuf text with `protoc` and
Debian's onnx.proto (libonnx-dev), its second layer (nodes node_layer_norm_2 .. node_add_323) is
repeated LAYERS - 2 more times with its values renamed and new seeded weights (normal, std 0.02) for
each copy's four matrices, the final LayerNorm reads the last copy, and the text is encoded again.
Metadata of fields the system onnx.proto does not know (field 9, the exporter's name scopes) is
dropped. Every copy has the structure of a real layer, so the loader finds LAYERS uses of one block.

Usage: bench/deep_gpt2.py OUT.onnx [--layers 12]
"""
import argparse, random, re, subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--src", default="tests/data/onnx/tiny_gpt2.onnx")
    a = ap.parse_args()
    random.seed(5)
    proto = ["-I/usr/include", "onnx/onnx.proto"]
    with open(a.src, "rb") as f:
        txt = subprocess.run(["protoc", "--decode=onnx.ModelProto", *proto], stdin=f, capture_output=True,
                             check=True).stdout.decode()
    txt = re.sub(r"\n( *)\d+ \{\n(?:\1  .*\n)*?\1\}", "", txt)  # unknown fields (metadata_props)
    gi = txt.index("\ngraph {")
    head, g = txt[:gi], txt[gi:]
    nodes = list(re.finditer(r"\n  node \{\n(.*?)\n  \}", g, re.S))
    names = [re.search(r'^    name: "(.*)"', m.group(1), re.M).group(1) for m in nodes]
    i0, i1 = names.index("node_layer_norm_2"), names.index("node_add_323")
    layer = [nodes[i].group(0) for i in range(i0, i1 + 1)]
    produced = set()
    for b in layer:
        produced.update(re.findall(r'^    output: "(.*)"', b, re.M))

    def copy(b, k, prev):
        def inp(m):
            x = m.group(1)
            if x == "add_201":  # the layer's input: the previous layer's output
                x = prev
            elif x in produced:
                x = f"{x}__L{k}"
            elif x.startswith("model.h.1."):
                x = x.replace("model.h.1.", f"model.h.{k}.")
            return f'    input: "{x}"'
        b = re.sub(r'^    output: "(.*)"', lambda m: f'    output: "{m.group(1)}__L{k}"', b, flags=re.M)
        b = re.sub(r'^    input: "(.*)"', inp, b, flags=re.M)
        return re.sub(r'^    name: "(.*)"', lambda m: f'    name: "{m.group(1)}__L{k}"', b, count=1, flags=re.M)

    extra, prev = "", "add_323"
    for k in range(2, a.layers):
        extra += "".join(copy(b, k, prev) for b in layer)
        prev = f"add_323__L{k}"
    g = g[:nodes[i1].end()] + extra + g[nodes[i1].end():]
    final_ln = '    input: "add_323"\n    input: "model.h.0.ln_1.weight"'
    j = g.rindex(final_ln)
    g = g[:j] + final_ln.replace("add_323", prev) + g[j + len(final_ln):]
    inits = re.findall(r'\n  initializer \{\n    dims: (\d+)\n    dims: (\d+)\n    data_type: 1\n    name: "(model\.h\.1\.[^"]*)"', txt)
    assert len(inits) == 4, inits
    new = ""
    for k in range(2, a.layers):
        for d0, d1, nm in inits:
            vals = " ".join(f"float_data: {random.gauss(0, 0.02):.6g}" for _ in range(int(d0) * int(d1)))
            new += (f'\n  initializer {{\n    dims: {d0}\n    dims: {d1}\n    data_type: 1\n    name: '
                    f'"{nm.replace("model.h.1.", f"model.h.{k}.")}"\n    {vals}\n  }}')
    ip = g.index("\n  initializer {")
    g = g[:ip] + new + g[ip:]
    with open(a.out, "wb") as f:
        subprocess.run(["protoc", "--encode=onnx.ModelProto", *proto], input=(head + g).encode(), stdout=f, check=True)
    print(f"wrote {a.out}: {a.layers} layers")


if __name__ == "__main__":
    main()
