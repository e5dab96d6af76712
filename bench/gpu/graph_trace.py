"""Summarizes bench/gpu/kernel_trace.cpp's traces: python3 graph_trace.py OUT.json TRACE.tsv...

Each TRACE.tsv (named <label>_L<length>.tsv) holds the kernels of N back-to-back replayed calls, in
start order. The calls are told apart by the repeat count, `calls` in the file name's sibling
<label>_L<length>.calls (the kernels divide evenly into them, else the file is reported and skipped).
Per trace and kernel position (launch order inside a call): the median over the calls of
  duration  end - start (a kernel launched on a programmatic edge starts before the one ahead ends, so
            its duration includes that wait);
  step      end - the previous kernel's end (the first: end - start): the kernel's share of the call's
            span when the kernels run one after another, so the steps add up to the span.
Sums per kind: library (cuBLASLt), product (the generated products, pt_product_*), attention,
row (the generated kernels), other. Per call: `idle_us`, the time no kernel ran between its first
kernel's start and its last one's end (the sum of the gaps between a kernel's start and the latest end
before it, where positive), its median and worst over the calls, and `graphs`, the distinct graphs the
kernels came from. One line per trace on stdout: label, span and idle medians."""
import json
import os
import re
import statistics
import sys


def kind(name):
    if "scaled_dot_product_attention" in name:
        return "attention"
    if name.startswith("pt_product"):
        return "product"
    if re.match(r"^(kernel\d+|ext\d+)", name):
        return "row"
    if name.startswith(("nvjet", "sm90", "cutlass", "void cutlass", "gemm", "Kernel")) or "gemm" in name.lower():
        return "library"
    return "other"


def summarize(path, calls):
    rows = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        f = line.rstrip("\n").split("\t")
        rows.append({"start": int(f[0]), "end": int(f[1]), "graph": int(f[2]), "grid": int(f[4]), "block": int(f[5]),
                     "cluster": int(f[6]), "name": f[7]})
    if not rows or len(rows) % calls:
        return {"error": f"{len(rows)} kernels do not divide into {calls} calls"}
    per = len(rows) // calls
    chunks = [rows[i * per:(i + 1) * per] for i in range(calls)]
    names = [k["name"] for k in chunks[0]]
    if any([k["name"] for k in c] != names for c in chunks):
        return {"error": "the calls launched different kernels"}
    spans, sums, idles = [], [], []
    dur = [[] for _ in range(per)]
    step = [[] for _ in range(per)]
    for c in chunks:
        spans.append((c[-1]["end"] - c[0]["start"]) / 1e3)
        sums.append(sum(k["end"] - k["start"] for k in c) / 1e3)
        prev = None
        idle = 0
        for i, k in enumerate(c):
            if prev is not None and k["start"] > prev:
                idle += k["start"] - prev
            dur[i].append((k["end"] - k["start"]) / 1e3)
            step[i].append((k["end"] - (prev if prev is not None else k["start"])) / 1e3)
            prev = max(prev or 0, k["end"])
        idles.append(idle / 1e3)
    kernels = []
    by_kind = {}
    for i, k in enumerate(chunks[0]):
        d, s = statistics.median(dur[i]), statistics.median(step[i])
        kernels.append({"name": k["name"], "grid": k["grid"], "block": k["block"], "cluster": k["cluster"],
                        "us": round(d, 2), "step_us": round(s, 2)})
        b = by_kind.setdefault(kind(k["name"]), {"launches": 0, "step_us": 0.0, "us": 0.0})
        b["launches"] += 1
        b["step_us"] = round(b["step_us"] + s, 2)
        b["us"] = round(b["us"] + d, 2)
    return {"calls": calls, "launches": per, "span_us_median": round(statistics.median(spans), 2),
            "span_us_worst": round(max(spans), 2), "sum_of_durations_us_median": round(statistics.median(sums), 2),
            "idle_us_median": round(statistics.median(idles), 2), "idle_us_worst": round(max(idles), 2),
            "graphs": len({k["graph"] for k in rows}),
            "by_kind": by_kind, "kernels": kernels}


def main():
    out = {}
    for path in sys.argv[2:]:
        label = os.path.basename(path)[:-4]
        calls_file = path[:-4] + ".calls"
        calls = int(open(calls_file).read()) if os.path.exists(calls_file) else 1
        try:
            out[label] = summarize(path, calls)
            r = out[label]
            if "error" not in r:
                print(f"{label}: span {r['span_us_median']} us (worst {r['span_us_worst']}), idle {r['idle_us_median']} us "
                      f"(worst {r['idle_us_worst']}), {r['launches']} launches, {r['graphs']} graph(s)")
        except (OSError, ValueError, IndexError) as e:
            out[label] = {"error": str(e)}
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
