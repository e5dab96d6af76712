#!/usr/bin/env python3
"""A/B of two cpu2_bench runs: processes of an old and a new binary (or one binary under two
environments) in turn, old new new old old new ..., each `--rounds` rounds; per (case, size,
threads) the median of the processes' medians, the worst sample, process CPU time per call, and the
2-over-1-thread speed-up of the cpu backend and of libtorch (measured in the same processes).
OMP_WAIT_POLICY=passive is set for both (the benchmark's policy, docs/cpu.md).

  python3 bench/cpu2_ab.py --old OLD/cpu2_bench --new build/cpu2_bench --pairs 2 --rounds 15 \
      --cases mlp,attention [--old-env 'PROTEAN_GEMM_TEAM=0'] [--new-env ...] --out bench/results/X.json
"""
import json, os, subprocess, sys, statistics, argparse
ap = argparse.ArgumentParser()
ap.add_argument('--old', required=True); ap.add_argument('--new', required=True)
ap.add_argument('--pairs', type=int, default=3); ap.add_argument('--rounds', type=int, default=15)
ap.add_argument('--cases', default='mlp'); ap.add_argument('--threads', default='1,2')
ap.add_argument('--old-env', default=''); ap.add_argument('--new-env', default='')
ap.add_argument('--extra', default=''); ap.add_argument('--tag', default='ab'); ap.add_argument('--out', default='')
ap.add_argument('--workdir', default='/tmp/cpu2_ab')
a = ap.parse_args()
os.makedirs(a.workdir, exist_ok=True)
res = {'old': [], 'new': []}
loads = []
for p in range(a.pairs):
    for which in (['old', 'new'] if p % 2 == 0 else ['new', 'old']):
        binp = a.old if which == 'old' else a.new
        envs = a.old_env if which == 'old' else a.new_env
        env = dict(os.environ, OMP_WAIT_POLICY='passive')
        for kv in envs.split():
            k, v = kv.split('=', 1); env[k] = v
        out = os.path.join(a.workdir, f'{a.tag}_{which}_{p}.json')
        cmd = [binp, '--rounds', str(a.rounds), '--threads', a.threads, '--cases', a.cases, '--out', out] + a.extra.split()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        j = json.load(open(out)); res[which].append(j)
        loads.append((which, j['context']['load_average_before'], j['context']['load_average_after']))
keys = []
for r in res['new'][0]['rows']:
    keys.append((r['case'], r['size'], r['threads']))
def agg(which, k, field):
    vals = []
    for j in res[which]:
        for r in j['rows']:
            if (r['case'], r['size'], r['threads']) == k and field in r: vals.append(r[field])
    return vals
summary = []
print(f"{'case':<10}{'size':<11}{'t':>2} | {'old cpu':>8} {'new cpu':>8} {'new/old':>7} | {'old wst':>8} {'new wst':>8} | {'torch':>8} | {'new cpuT':>8} {'old cpuT':>8} | {'old int':>8} {'new int':>8}")
for k in keys:
    om = statistics.median(agg('old', k, 'cpu_median_us')); nm = statistics.median(agg('new', k, 'cpu_median_us'))
    ow = max(agg('old', k, 'cpu_worst_us')); nw = max(agg('new', k, 'cpu_worst_us'))
    tm = statistics.median(agg('old', k, 'libtorch_median_us') + agg('new', k, 'libtorch_median_us'))
    nct = statistics.median(agg('new', k, 'cpu_cpu_time_median_us')); oct_ = statistics.median(agg('old', k, 'cpu_cpu_time_median_us'))
    oi = statistics.median(agg('old', k, 'interp_median_us')); ni = statistics.median(agg('new', k, 'interp_median_us'))
    print(f"{k[0]:<10}{k[1]:<11}{k[2]:>2} | {om:8.1f} {nm:8.1f} {nm/om:7.3f} | {ow:8.1f} {nw:8.1f} | {tm:8.1f} | {nct:8.1f} {oct_:8.1f} | {oi:8.1f} {ni:8.1f}")
    summary.append(dict(case=k[0], size=k[1], threads=k[2], old_cpu_median_us=om, new_cpu_median_us=nm, old_cpu_worst_us=ow, new_cpu_worst_us=nw,
                        libtorch_median_us=tm, old_cpu_time_us=oct_, new_cpu_time_us=nct, old_interp_median_us=oi, new_interp_median_us=ni,
                        old_libtorch_median_us=statistics.median(agg('old', k, 'libtorch_median_us') or [0]),
                        new_libtorch_median_us=statistics.median(agg('new', k, 'libtorch_median_us') or [0])))
# scaling
for which in ('old', 'new'):
    for k in keys:
        if k[2] == 2:
            k1 = (k[0], k[1], 1)
            if k1 in keys:
                c1 = statistics.median(agg(which, k1, 'cpu_median_us')); c2 = statistics.median(agg(which, k, 'cpu_median_us'))
                t1 = statistics.median(agg(which, k1, 'libtorch_median_us') or [0]); t2 = statistics.median(agg(which, k, 'libtorch_median_us') or [1])
                print(f"{which} {k[0]} {k[1]}: cpu 1->2 {c1:.0f}->{c2:.0f} = {c1/c2:.2f}x ; libtorch {t1:.0f}->{t2:.0f} = {t1/t2:.2f}x")
print('loads', loads)
if a.out:
    json.dump(dict(pairs=a.pairs, rounds=a.rounds, old=a.old, new=a.new, old_env=a.old_env, new_env=a.new_env, loads=loads, rows=summary,
                   raw={w: res[w] for w in res}), open(a.out, 'w'), indent=1)
