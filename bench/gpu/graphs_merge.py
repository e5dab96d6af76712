#!/usr/bin/env python3
"""Merges what `PROTEAN_GPU_GPT2_GRAPHS=1 bench/gpu/graphs.sh OUTDIR` left in OUTDIR into one JSON:

    python3 bench/gpu/graphs_merge.py OUTDIR RESULT.json

GPT-2 small bf16 per length: Protean reduce-overhead (steady median and worst), Protean default mode,
torch.compile reduce-overhead (same run), the ratio torch / Protean; CUDA graphs recorded over the 12
lengths on both sides; the first call of new lengths inside known buckets; the small-function host
times (protean_cuda_bench --graphs); the test and memcheck summaries; each step's exit status."""
import json
import os
import re
import sys


def load(out, name):
    """The file's last JSON line (a step may print progress or a partial line first)."""
    try:
        text = open(os.path.join(out, name)).read()
        try:
            return json.loads(text)
        except ValueError:
            return json.loads([l for l in text.splitlines() if l.startswith("{")][-1])
    except Exception as e:  # a failed or cut-short step: keep its error
        return {"error": repr(e)}


def main():
    out, dest = sys.argv[1], sys.argv[2]
    log = open(os.path.join(out, "steps.log")).read() if os.path.exists(os.path.join(out, "steps.log")) else ""
    steps = re.findall(r"^steps: (\{.*\})$", log, re.M)
    tests = open(os.path.join(out, "tests.log")).read() if os.path.exists(os.path.join(out, "tests.log")) else ""
    memcheck = open(os.path.join(out, "memcheck.log")).read() if os.path.exists(os.path.join(out, "memcheck.log")) else ""
    pg, pd = load(out, "gpt2_protean_graphs.json"), load(out, "gpt2_protean_default.json")
    tg = load(out, "gpt2_torch_graphs.json").get("compile_reduce_overhead", {})
    rows = []
    by_len = {L["seq"]: L for L in pd.get("lengths", [])}
    for L in pg.get("lengths", []):
        s = L["seq"]
        p = L.get("steady_ms", {})
        d = by_len.get(s, {}).get("steady_ms", {})
        t = tg.get("steady", {}).get(str(s), {})
        rows.append({"seq": s, "protean_graphs_ms": p.get("median"), "protean_graphs_worst_ms": p.get("worst"),
                     "protean_default_ms": d.get("median"), "torch_reduce_overhead_ms": t.get("median"),
                     "torch_reduce_overhead_worst_ms": t.get("worst"),
                     "speedup_vs_torch_reduce_overhead": round(t["median"] / p["median"], 3)
                     if t.get("median") and p.get("median") else None,
                     "rel_l2_vs_torch_bf16": L.get("vs_torch_bf16", {}).get("rel_l2")})
    summary = {
        "steady": rows,
        "graphs_recorded_12_lengths": {"protean": pg.get("graph_recordings_12_lengths"),
                                       "protean_buckets": pg.get("graph_buckets_12_lengths"),
                                       "torch": tg.get("cuda_graphs_recorded_12_lengths")},
        "new_lengths_in_known_buckets": {"protean": pg.get("new_lengths_in_known_buckets"),
                                         "protean_default_mode": pd.get("new_lengths_in_known_buckets"),
                                         "torch": tg.get("new_lengths")},
        "first_results_s": {"protean_graphs": pg.get("first_results_s"), "protean_default": pd.get("first_results_s"),
                            "torch_reduce_overhead": tg.get("first_results_s")},
        "tests": [l for l in tests.splitlines() if re.match(r"\[  (PASSED|FAILED|SKIPPED) ", l)],
        "memcheck": [l for l in memcheck.splitlines() if "ERROR SUMMARY" in l],
    }
    r = {"benchmark": "mode reduce-overhead (CUDA graphs per size bucket, cuBLASLt captured) on GPT-2 small bf16 vs "
                      "torch.compile reduce-overhead, same run; small-function host times; graph tests and memcheck",
         "device": pg.get("device") or tg.get("device"), "env": log.split("== ")[0].strip(),
         "steps": json.loads(steps[-1]) if steps else None, "summary": summary,
         "protean_graphs": pg, "protean_default": pd, "torch": load(out, "gpt2_torch_graphs.json"),
         "protean_small_function": load(out, "protean_graphs.json"), "tests_log_tail": tests[-4000:],
         "steps_log_tail": log[-6000:]}
    json.dump(r, open(dest, "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
