#!/usr/bin/env node
'use strict';
// PP-OCRv4 rec and det: Protean (eager, interp, cpu backends) vs ONNX Runtime CPU, same thread count,
// measured in the same run. Writes one JSON file and prints a markdown table (docs/benchmarks.md).
//
// Usage: node bench/ocr_vs_ort.js [--protean build/protean] [--threads 1,2] [--rounds 3] [--repeat 10]
//          [--warmup 3] [--runners ort,eager,interp,cpu] [--rec-widths 160,...] [--det 640x640]
//          [--compile-reps 5] [--out bench/results/ocr_vs_ort_DATE.json] [--work DIR]
//          [--base PATH --runners ort,cpu,base]
//
// Method:
//  * Every measurement is a separate process: `protean run MODEL x=random:DIMS{,...} --backend B
//    --threads T --repeat R --warmup W` (or `--eager`), and `node bench/ort_bench.js` for ONNX Runtime
//    (intraOpNumThreads = T, inter-op 1, graph optimizations at ORT's default). One process per
//    (runner, model, threads) sweeps every shape of that model, so Protean's cpu backend compiles the
//    way a user sees it: a static graph for the first width, one dynamic recompile for the second,
//    cache hits after that. Warm-up calls (untimed) absorb those compiles.
//  * Peak memory = the process's max RSS (/usr/bin/time for Protean; process.resourceUsage() of the
//    node process for ONNX Runtime, which includes node itself: ~40 MB, see `node_baseline_rss_mb`).
//  * Rounds: every round runs every (threads, runner) once, in a rotated order, so slow phases of a
//    shared machine hit all runners alike; medians are over all timed calls of all rounds.
//  * Runner `base` (with --base PATH): another Protean binary (e.g. a build of the commit before a
//    change) on the cpu backend with its own artifact cache, measured in the same rounds: an A/B
//    comparison that the machine's load affects like the other runners.
//  * CPU time per call (whole process, all threads) is recorded next to wall time: on a shared, loaded
//    machine wall time includes waiting for a core, CPU time does not (with 2 threads it also counts
//    spinning worker threads, so compare it across runtimes only at 1 thread).
//  * Compile time of the cpu backend per graph: `protean run` with --repeat 1 in a fresh
//    PROTEAN_CACHE_DIR (cold: codegen + g++ + dlopen), then again in new processes with the same dir
//    (warm: the artifact comes from the disk cache). Reported from compile stats' phase_seconds (wall)
//    and phase_cpu_seconds (CPU time of the compiling thread; g++ runs in a child and is not in it).
const { spawnSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const { ROOT, dieFor, median, round, sh, machine, gitState } = require('./bench_util');

const die = dieFor('ocr_vs_ort');

function parseArgs(argv) {
  const o = { protean: path.join(ROOT, 'build', 'protean'), threads: [1, 2], rounds: 3, repeat: 10, warmup: 3,
    runners: ['ort', 'eager', 'interp', 'cpu'], recWidths: [160, 320, 480, 640, 800, 960], det: ['640x640'],
    compileReps: 5, out: null, work: null, base: null };
  const need = (i) => {
    if (i + 1 >= argv.length) die(`${argv[i]} needs a value`);
    return argv[i + 1];
  };
  const ints = (v, flag, min = 1) => v.split(',').map((x) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n < min) die(`${flag}: '${x}' is not an integer >= ${min}`);
    return n;
  });
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--protean') o.protean = path.resolve(need(i++));
    else if (a === '--threads') o.threads = ints(need(i++), a);
    else if (a === '--rounds') o.rounds = ints(need(i++), a, 0)[0];  // 0: compile times only
    else if (a === '--repeat') o.repeat = ints(need(i++), a)[0];
    else if (a === '--warmup') o.warmup = ints(need(i++), a, 0)[0];
    else if (a === '--compile-reps') o.compileReps = ints(need(i++), a)[0];
    else if (a === '--rec-widths') o.recWidths = ints(need(i++), a);
    else if (a === '--det') o.det = need(i++).split(',').filter((s) => s);
    else if (a === '--runners') {
      o.runners = need(i++).split(',');
      for (const r of o.runners)
        if (!['ort', 'eager', 'interp', 'cpu', 'base'].includes(r)) die(`--runners: unknown runner '${r}'`);
    } else if (a === '--out') o.out = path.resolve(need(i++));
    else if (a === '--work') o.work = path.resolve(need(i++));
    else if (a === '--base') o.base = path.resolve(need(i++));
    else die(`unknown argument '${a}' (see the usage at the top of ${__filename})`);
  }
  for (const d of o.det) if (!/^\d+x\d+$/.test(d)) die(`--det: '${d}' is not like 640x640`);
  if (!fs.existsSync(o.protean)) die(`${o.protean} not found: build first (scripts/build.sh) or pass --protean`);
  if (o.runners.includes('base') && !(o.base && fs.existsSync(o.base))) die('runner base needs --base PATH (a protean binary)');
  return o;
}

const cacheRoot = process.env.PROTEAN_CACHE_DIR || path.join(os.homedir(), '.cache', 'protean');
const modelsDir = process.env.PROTEAN_MODELS_DIR || path.join(os.homedir(), '.cache', 'protean', 'models');
const ortDir = path.join(cacheRoot, 'node', 'node_modules');

const loadavg = () => os.loadavg().map((x) => round(x, 2));

function run(cmd, args, env) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', cwd: ROOT, env: { ...process.env, ...env },
    maxBuffer: 64 << 20 });
  if (r.status !== 0) die(`${cmd} ${args.join(' ')} failed (exit ${r.status}):\n${r.stderr}\n${r.stdout}`);
  return r.stdout;
}

/// One Protean process: returns {shapes: {dims: times_ms[]}, rss_mb, stats}.
function runProtean(o, work, model, shapes, runner, threads, repeat, warmup, cacheDir) {
  const bin = runner === 'base' ? o.base : o.protean;
  if (runner === 'base') runner = 'cpu';
  const statsFile = path.join(work, 'stats.json');
  const rssFile = path.join(work, 'rss.txt');
  const dims = shapes.length === 1 ? shapes[0] : shapes[0].replace(/x\d+$/, '') + 'x{' +
    shapes.map((s) => s.split('x').pop()).join(',') + '}';
  if (shapes.length > 1 && !shapes.every((s) => s.replace(/x\d+$/, '') === shapes[0].replace(/x\d+$/, '')))
    die('a Protean sweep may only vary the last dim');
  const args = ['-f', '%M', '-o', rssFile, bin, 'run', model, `x=random:${dims}`, '--threads', String(threads),
    '--repeat', String(repeat), '--warmup', String(warmup), '--stats-json', statsFile, '-q'];
  if (runner === 'eager') args.push('--eager');
  else args.push('--backend', runner);
  // LD_LIBRARY_PATH: a copy of the binaries (e.g. taken before a rebuild) uses its own libprotean.
  const libPath = [path.dirname(bin), process.env.LD_LIBRARY_PATH].filter((x) => x).join(':');
  run('/usr/bin/time', args, { PROTEAN_CACHE_DIR: cacheDir, OMP_NUM_THREADS: String(threads), LD_LIBRARY_PATH: libPath });
  const st = JSON.parse(fs.readFileSync(statsFile, 'utf8'));
  const rssKb = Number(fs.readFileSync(rssFile, 'utf8').trim().split('\n').pop());
  const out = {}, cpu = {};
  for (const c of st.calls) {
    out[c.inputs[0]] = c.latencies_ms;
    cpu[c.inputs[0]] = c.cpu_ms || [];
  }
  return { shapes: out, cpu, rss_mb: Math.round(rssKb / 1024), stats: st.stats, phaseCpu: st.phase_cpu_seconds || {} };
}

function runOrt(model, shapes, threads, repeat, warmup) {
  const out = run('node', [path.join(ROOT, 'bench', 'ort_bench.js'), model, '--shapes', shapes.join(','), '--threads',
    String(threads), '--repeat', String(repeat), '--warmup', String(warmup), '--ort', ortDir], {});
  const j = JSON.parse(out);
  const res = {}, cpu = {};
  for (const [k, v] of Object.entries(j.shapes)) {
    res[k] = v.times_ms;
    cpu[k] = v.cpu_ms;
  }
  return { shapes: res, cpu, rss_mb: j.max_rss_mb, ort_version: j.ort_version };
}

function compileTimes(o, work, model, dims) {
  const dir = path.join(work, `compile-cache-${path.basename(model, '.onnx')}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const one = () => {
    const r = runProtean(o, work, model, [dims], 'cpu', 1, 1, 0, dir);
    const ph = r.stats.phase_seconds || {};
    const total = Object.values(ph).reduce((a, b) => a + b, 0);
    const cpu = r.phaseCpu;
    const cpuTotal = Object.values(cpu).reduce((a, b) => a + b, 0);
    return { total_ms: round(total * 1000, 1), capture_ms: round((ph.capture || 0) * 1000, 1),
      passes_ms: round((ph.passes || 0) * 1000, 1), backend_ms: round((ph.backend || 0) * 1000, 1),
      cpu_total_ms: round(cpuTotal * 1000, 1), cpu_capture_ms: round((cpu.capture || 0) * 1000, 1),
      cpu_backend_ms: round((cpu.backend || 0) * 1000, 1), first_call_ms: round(r.shapes[dims][0], 1),
      first_call_cpu_ms: round((r.cpu[dims] || [null])[0], 1) };
  };
  const cold = one();
  const warm = [];
  for (let i = 0; i < o.compileReps; i++) warm.push(one());
  const med = (k) => round(median(warm.map((w) => w[k])), 1);
  const keys = Object.keys(cold);
  return { model: path.basename(model), input: dims, cold, warm_runs: warm,
    warm_median: Object.fromEntries(keys.map((k) => [k, med(k)])) };
}

function main() {
  const o = parseArgs(process.argv.slice(2));
  const date = new Date().toISOString().slice(0, 10);
  o.out = o.out || path.join(ROOT, 'bench', 'results', `ocr_vs_ort_${date}.json`);
  const work = o.work || fs.mkdtempSync(path.join(os.tmpdir(), 'protean-ocr-bench-'));
  fs.mkdirSync(work, { recursive: true });
  const benchCache = path.join(work, 'cache');  // the latency runs share one artifact cache
  const rec = path.join(modelsDir, 'ch_PP-OCRv4_rec_infer.onnx');
  const det = path.join(modelsDir, 'ch_PP-OCRv4_det_infer.onnx');
  for (const m of [rec, det]) if (!fs.existsSync(m)) die(`${m} missing: run scripts/fetch_models.sh`);
  const { commit, dirty } = gitState();
  const models = [{ name: 'rec', path: rec, shapes: o.recWidths.map((w) => `1x3x48x${w}`) }];
  for (const d of o.det) models.push({ name: 'det', path: det, shapes: [`1x3x${d}`] });

  const result = { benchmark: 'ocr_vs_ort', date: new Date().toISOString(), machine: machine(), commit, dirty,
    command: `node bench/ocr_vs_ort.js ${process.argv.slice(2).join(' ')}`.trim(),
    config: { threads: o.threads, rounds: o.rounds, repeat: o.repeat, warmup: o.warmup, runners: o.runners,
      protean: o.protean, base: o.base },
    load_before: loadavg(), uptime_before: sh('uptime', []), rounds: [], node_baseline_rss_mb: null };
  result.node_baseline_rss_mb = Math.round(JSON.parse(run('node', ['-e',
    'process.stdout.write(JSON.stringify(process.resourceUsage().maxRSS))'], {})) / 1024);

  process.stderr.write(`compile times (cpu backend, cold then ${o.compileReps} warm processes)...\n`);
  result.compile = [compileTimes(o, work, rec, '1x3x48x320')];
  for (const d of o.det) result.compile.push(compileTimes(o, work, det, `1x3x${d}`));

  // samples[model][shape][threads][runner] = times; rss[model][threads][runner] = max over rounds
  const samples = {};
  const cpuSamples = {};
  const rss = {};
  let ortVersion = null;
  const jobs = [];
  for (const m of models) for (const t of o.threads) for (const r of o.runners) jobs.push({ m, t, r });
  for (let k = 0; k < o.rounds; k++) {
    const rot = jobs.map((_, i) => jobs[(i + k * Math.max(1, Math.floor(jobs.length / o.rounds))) % jobs.length]);
    const roundInfo = { round: k, load_before: loadavg() };
    for (const { m, t, r } of rot) {
      process.stderr.write(`round ${k + 1}/${o.rounds}: ${m.name} ${m.shapes.join(',')} ${r} threads=${t}\n`);
      const res = r === 'ort' ? runOrt(m.path, m.shapes, t, o.repeat, o.warmup)
                              : runProtean(o, work, m.path, m.shapes, r, t, o.repeat, o.warmup,
                                           r === 'base' ? `${benchCache}-base` : benchCache);
      if (res.ort_version) ortVersion = res.ort_version;
      for (const [shape, times] of Object.entries(res.shapes)) {
        const cell = (((samples[m.name] ||= {})[shape] ||= {})[t] ||= {});
        (cell[r] ||= []).push(...times);
        const ccell = (((cpuSamples[m.name] ||= {})[shape] ||= {})[t] ||= {});
        (ccell[r] ||= []).push(...(res.cpu[shape] || []));
      }
      const rc = ((rss[m.name] ||= {})[t] ||= {});
      rc[r] = Math.max(rc[r] || 0, res.rss_mb);
    }
    roundInfo.load_after = loadavg();
    result.rounds.push(roundInfo);
  }
  result.ort_version = ortVersion;
  result.load_after = loadavg();
  result.uptime_after = sh('uptime', []);

  result.results = [];
  for (const [model, byShape] of Object.entries(samples))
    for (const [shape, byThreads] of Object.entries(byShape))
      for (const [t, byRunner] of Object.entries(byThreads)) {
        const row = { model, shape, threads: Number(t), median_ms: {}, n: {}, ratio_vs_ort: {}, median_cpu_ms: {},
          cpu_ratio_vs_ort: {} };
        const cpuBy = cpuSamples[model][shape][t];
        for (const [r, v] of Object.entries(byRunner)) {
          row.median_ms[r] = round(median(v));
          row.n[r] = v.length;
          if (cpuBy[r] && cpuBy[r].length) row.median_cpu_ms[r] = round(median(cpuBy[r]));
        }
        for (const r of Object.keys(row.median_ms)) {
          if (r === 'ort') continue;
          if (row.median_ms.ort) row.ratio_vs_ort[r] = round(row.median_ms[r] / row.median_ms.ort);
          if (row.median_cpu_ms.ort && row.median_cpu_ms[r])
            row.cpu_ratio_vs_ort[r] = round(row.median_cpu_ms[r] / row.median_cpu_ms.ort);
        }
        row.cpu_samples_ms = Object.fromEntries(Object.entries(cpuBy).map(([r, v]) => [r, v.map((x) => round(x))]));
        row.samples_ms = Object.fromEntries(Object.entries(byRunner).map(([r, v]) => [r, v.map((x) => round(x))]));
        result.results.push(row);
      }
  result.peak_rss_mb = rss;
  fs.mkdirSync(path.dirname(o.out), { recursive: true });
  fs.writeFileSync(o.out, JSON.stringify(result, null, 1) + '\n');

  // Markdown summary.
  const rs = o.runners.filter((r) => r !== 'ort');
  const lines = [];
  lines.push(`| model | input | threads | ORT ms | ${rs.map((r) => `${r} ms`).join(' | ')} | ` +
             `${rs.map((r) => `${r}/ORT`).join(' | ')} | ${rs.map((r) => `${r}/ORT (CPU time)`).join(' | ')} |`);
  lines.push(`|${'---|'.repeat(4 + 3 * rs.length)}`);
  const f2 = (x) => (x === undefined || x === null ? '-' : x.toFixed(2));
  const f1 = (x) => (x === undefined || x === null ? '-' : x.toFixed(1));
  for (const row of result.results)
    lines.push(`| ${row.model} | ${row.shape} | ${row.threads} | ${f1(row.median_ms.ort)} | ` +
               `${rs.map((r) => f1(row.median_ms[r])).join(' | ')} | ` +
               `${rs.map((r) => f2(row.ratio_vs_ort[r])).join(' | ')} | ` +
               `${rs.map((r) => f2(row.cpu_ratio_vs_ort[r])).join(' | ')} |`);
  lines.push('');
  lines.push(`| model | threads | ${o.runners.map((r) => `${r} peak RSS MB`).join(' | ')} |`);
  lines.push(`|${'---|'.repeat(2 + o.runners.length)}`);
  for (const [model, byT] of Object.entries(rss))
    for (const [t, byR] of Object.entries(byT))
      lines.push(`| ${model} | ${t} | ${o.runners.map((r) => byR[r] ?? '-').join(' | ')} |`);
  lines.push('');
  lines.push('| model | input | cold wall ms | warm wall ms (capture + passes + backend) | warm CPU ms (capture + backend) | ' +
             'warm first call wall ms | first call after the warm compile, wall / CPU ms |');
  lines.push('|---|---|---|---|---|---|---|');
  for (const c of result.compile) {
    const w = c.warm_median;
    lines.push(`| ${c.model} | ${c.input} | ${c.cold.total_ms} | ${w.total_ms} (${w.capture_ms} + ${w.passes_ms} + ` +
               `${w.backend_ms}) | ${w.cpu_total_ms} (${w.cpu_capture_ms} + ${w.cpu_backend_ms}) | ${w.first_call_ms} | ` +
               `${round(w.first_call_ms - w.total_ms, 1)} / ${round(w.first_call_cpu_ms - w.cpu_total_ms, 1)} |`);
  }
  process.stdout.write(lines.join('\n') + '\n');
  process.stderr.write(`wrote ${o.out} (load before ${result.load_before}, after ${result.load_after})\n`);
}

main();
