"""Collects the JSON each run of a GPU script wrote into one file:
collect_runs.py RUNS_DIR OUT_JSON [--split PREFIX OUT2_JSON] [--summary]
Each RUNS_DIR/NAME.json becomes OUT_JSON's entry NAME (in the order the runs ended); a file that is not
one JSON object is read from its last line that starts with '{', else kept as an error with its tail.
--split: the runs whose name starts with PREFIX go to OUT2_JSON instead. --summary: one line per
protean_gpt2_bench run on stdout (steady medians per length, cuBLASLt figures, plain runs)."""
import glob
import json
import os
import sys


def read_run(path):
    text = open(path).read()
    try:
        return json.loads(text)
    except Exception:
        lines = [l for l in text.splitlines() if l.startswith("{")]
        try:
            return json.loads(lines[-1])
        except Exception as e:
            return {"error": repr(e), "text": text[-1500:]}


def main(argv):
    runs_dir, out = argv[1], argv[2]
    split = None
    summary = "--summary" in argv
    if "--split" in argv:
        i = argv.index("--split")
        split = (argv[i + 1], argv[i + 2])
    runs, other = {}, {}
    for f in sorted(glob.glob(os.path.join(runs_dir, "*.json")), key=os.path.getmtime):
        name = os.path.basename(f)[:-5]
        (other if split and name.startswith(split[0]) else runs)[name] = read_run(f)
    json.dump(runs, open(out, "w"))
    if split:
        json.dump(other, open(split[1], "w"))
    if summary:
        for name, d in runs.items():
            steady = {str(r["seq"]): r["steady_ms"]["median"] for r in d.get("lengths", []) if "steady_ms" in r}
            print(name, json.dumps(steady), "cublaslt", json.dumps(d.get("cublaslt")), "plain", d.get("graph_plain_runs"),
                  "first_results_s", d.get("first_results_s"), "rel_l2", d.get("worst_rel_l2_vs_torch_bf16"))


if __name__ == "__main__":
    main(sys.argv)
