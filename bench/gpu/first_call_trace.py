"""Where a new length's first call spends its extra GPU time: python3 first_call_trace.py OUT.json TRACE.tsv...

Each TRACE.tsv is bench/gpu/kernel_trace.cpp's output of `protean_gpt2_bench ... --profile-new-length L
--profile-repeat N`: N + 1 windows of one call each, window 0 the first call at the new length, the
others steady calls at it. Per trace:
  lead      from the window's start (cuProfilerStart's return, just before f(x) was called) to the
            call's first kernel. Under CUPTI this is mostly the tracer's own launch latency (0.2 ms for
            a first call, 0.7-5 ms for steady ones on an H100 with the CUPTI of CUDA 13), so it does not
            show what a launch costs untraced: the events of protean_gpt2_bench --steady do;
  span      the first kernel's start to the last kernel's end: the kernels' time on the device;
  copies    the memcpy records (PROTEAN_KERNEL_TRACE_MEMCPY=1) and their durations;
  kernels   the kernel count; when the first call ran the same kernels as the steady ones (same names
            in the same order), per position the first call's duration and step (end - the previous
            record's end) against the median of the steady calls, and the positions whose step grew
            most.
The first call's figures are one sample; the steady side is a median over N calls."""
import json
import os
import statistics
import sys


def read_windows(path):
    windows = []
    for line in open(path):
        if line.startswith("# window"):
            f = line.split()
            windows.append({"start": int(f[3]), "end": int(f[4]), "rows": []})
            continue
        if line.startswith("#") or not line.strip():
            continue
        if not windows:
            raise ValueError(f"{path}: a record before any `# window` line (a trace of --profile-call?)")
        f = line.rstrip("\n").split("\t")
        windows[-1]["rows"].append({"start": int(f[0]), "end": int(f[1]), "grid": int(f[4]), "block": int(f[5]), "name": f[7]})
    return windows


def call_figures(w):
    rows = w["rows"]
    if not rows:
        return None
    kernels = [r for r in rows if not r["name"].startswith("memcpy ")]
    copies = [r for r in rows if r["name"].startswith("memcpy ")]
    steps, prev = [], None
    for r in kernels:
        steps.append((r["end"] - (prev if prev is not None else r["start"])) / 1e3)
        prev = r["end"]
    if not kernels:
        return None
    return {
        "lead_us": (kernels[0]["start"] - w["start"]) / 1e3,
        "span_us": (max(r["end"] for r in kernels) - kernels[0]["start"]) / 1e3,
        "kernels": len(kernels),
        "names": [r["name"] for r in kernels],
        "durations_us": [(r["end"] - r["start"]) / 1e3 for r in kernels],
        "steps_us": steps,
        "copies": [{"name": r["name"], "us": (r["end"] - r["start"]) / 1e3,
                    "after_window_start_us": (r["start"] - w["start"]) / 1e3} for r in copies],
    }


def summarize(path):
    windows = read_windows(path)
    calls = [call_figures(w) for w in windows]
    if len(calls) < 2 or any(c is None for c in calls):
        return {"error": f"{len(calls)} windows, {sum(c is None for c in calls)} of them empty: need a first call and steady ones"}
    first, steady = calls[0], calls[1:]
    med = lambda xs: round(statistics.median(xs), 2)
    out = {
        "steady_calls": len(steady),
        "first": {"lead_us": round(first["lead_us"], 2), "span_us": round(first["span_us"], 2), "kernels": first["kernels"],
                  "copies": first["copies"]},
        "steady": {"lead_us": med([c["lead_us"] for c in steady]), "span_us": med([c["span_us"] for c in steady]),
                   "kernels": med([c["kernels"] for c in steady]),
                   "copies_per_call": med([len(c["copies"]) for c in steady])},
    }
    out["extra_us"] = {"lead": round(out["first"]["lead_us"] - out["steady"]["lead_us"], 2),
                       "span": round(out["first"]["span_us"] - out["steady"]["span_us"], 2)}
    if any(c["names"] != first["names"] for c in steady):
        out["positions"] = "the first call ran other kernels than the steady calls: no per-kernel comparison"
        return out
    per = []
    for i, name in enumerate(first["names"]):
        sd = med([c["durations_us"][i] for c in steady])
        ss = med([c["steps_us"][i] for c in steady])
        per.append({"position": i, "name": name[:80], "first_duration_us": round(first["durations_us"][i], 2),
                    "steady_duration_us": sd, "first_step_us": round(first["steps_us"][i], 2), "steady_step_us": ss,
                    "extra_step_us": round(first["steps_us"][i] - ss, 2)})
    out["extra_step_sum_us"] = round(sum(p["extra_step_us"] for p in per), 2)
    out["top_extra_steps"] = sorted(per, key=lambda p: -p["extra_step_us"])[:12]
    out["first_positions"] = per[:6]
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: first_call_trace.py OUT.json TRACE.tsv...")
    result = {}
    for path in sys.argv[2:]:
        try:
            result[os.path.basename(path)] = summarize(path)
        except (OSError, ValueError, IndexError) as e:
            result[os.path.basename(path)] = {"error": str(e)}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
    for name, r in result.items():
        if "error" in r:
            print(f"{name}: {r['error']}")
            continue
        print(f"{name}: first call lead {r['first']['lead_us']} us, span {r['first']['span_us']} us; steady lead "
              f"{r['steady']['lead_us']}, span {r['steady']['span_us']} (extra lead {r['extra_us']['lead']}, span {r['extra_us']['span']})")
        for c in r["first"]["copies"]:
            print(f"  first call {c['name']}: {c['us']} us at +{c['after_window_start_us']} us")
        for p in r.get("top_extra_steps", [])[:6]:
            print(f"  +{p['extra_step_us']} us at #{p['position']} {p['name']} (step {p['first_step_us']} vs {p['steady_step_us']})")


if __name__ == "__main__":
    main()
