#!/usr/bin/env node
'use strict';
// The ≥ 70%-of-memcpy kernels (softmax, layer_norm + gelu on rows × 4096 f32) sampled over time.
//
// One cpu_bench run measures a kernel and its memcpy peer in the same minute (bench/memcpy_peer.h), but
// on a shared VM the host's load moves compute-bound kernels by up to ±20% from one minute to the
// next while the copy moves less, so one run's mem_frac says more about that minute than about the
// kernel. This script repeats the same short cpu_bench run every `--gap` seconds for `--samples`
// rounds, each round on every thread count in turn (rotated), and reports per (kernel, threads) the
// median, min and max over the rounds of each round's mem_frac, and how many rounds reached 0.70.
//
// Usage: node bench/kernel_samples.js [--bench build/cpu_bench] [--samples 20] [--gap 30]
//          [--threads 1,2] [--rows 4096] [--reps 5] [--out bench/results/cpu_samples_DATE.json]
//
// Each sample: OMP_NUM_THREADS = PROTEAN_NUM_THREADS = T, OMP_WAIT_POLICY=passive, `cpu_bench
// --benchmark_filter=(Softmax|LayerNormGelu)/rows:R/compiled:1 --benchmark_repetitions=REPS`; the
// figures taken are the median-aggregate counters kernel_median_ms, memcpy_median_ms and mem_frac.
const { spawnSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { ROOT, dieFor, machine, gitState } = require('./bench_util');

const die = dieFor('kernel_samples');

function parseArgs(argv) {
  const o = { bench: path.join(ROOT, 'build/cpu_bench'), samples: 20, gap: 30, threads: [1, 2], rows: 4096, reps: 5, out: '' };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) die(`${a} needs a value`);
      return argv[++i];
    };
    const num = (s, what) => {
      const n = Number(s);
      if (!Number.isInteger(n) || n < 0) die(`${what} must be a non-negative integer, got "${s}"`);
      return n;
    };
    if (a === '--bench') o.bench = v();
    else if (a === '--samples') o.samples = num(v(), '--samples');
    else if (a === '--gap') o.gap = num(v(), '--gap');
    else if (a === '--threads') o.threads = v().split(',').map((s) => num(s, '--threads'));
    else if (a === '--rows') o.rows = num(v(), '--rows');
    else if (a === '--reps') o.reps = num(v(), '--reps');
    else if (a === '--out') o.out = v();
    else die(`unknown argument "${a}" (see the usage at the top of bench/kernel_samples.js)`);
  }
  if (!fs.existsSync(o.bench)) die(`${o.bench} does not exist: build first (scripts/build.sh)`);
  if (o.samples < 1) die('--samples must be at least 1');
  if (o.reps < 2) die('--reps must be at least 2 (cpu_bench reports medians only over repetitions)');
  if (o.rows < 1) die('--rows must be at least 1');
  if (!o.threads.length || o.threads.some((t) => t < 1)) die('--threads must list thread counts of at least 1, e.g. 1,2');
  return o;
}

/// The upper middle value of `v` (NaN for none): the median memcpy_peer.h's median_of takes, so a
/// round's figures and the summary over rounds use one definition.
function upperMedian(v) {
  const s = [...v].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : NaN;
}

function sampleOnce(o, threads) {
  const env = { ...process.env, OMP_NUM_THREADS: String(threads), PROTEAN_NUM_THREADS: String(threads), OMP_WAIT_POLICY: 'passive' };
  const args = [`--benchmark_filter=(Softmax|LayerNormGelu)/rows:${o.rows}/compiled:1/`, `--benchmark_repetitions=${o.reps}`,
    '--benchmark_report_aggregates_only=true', '--benchmark_format=json'];
  const r = spawnSync(o.bench, args, { env, maxBuffer: 64 << 20 });
  if (r.status !== 0) die(`${o.bench} exited with ${r.status}: ${r.stderr.toString().slice(-2000)}`);
  let doc;
  try {
    doc = JSON.parse(r.stdout.toString());
  } catch {
    die(`${o.bench} printed no JSON for the filter ${args[0]} (cpu_bench registers rows 256, 1024 and 4096)`);
  }
  const out = {};
  for (const b of doc.benchmarks) {
    if (b.aggregate_name !== 'median') continue;
    const kernel = b.run_name.startsWith('BM_Softmax') ? 'softmax' : 'layer_norm_gelu';
    out[kernel] = { kernel_median_ms: b.kernel_median_ms, memcpy_median_ms: b.memcpy_median_ms, mem_frac: b.mem_frac };
  }
  if (!out.softmax || !out.layer_norm_gelu) die(`cpu_bench printed no median for one of the kernels (filter rows:${o.rows})`);
  return out;
}

function main() {
  const o = parseArgs(process.argv.slice(2));
  const date = new Date().toISOString().slice(0, 10);
  const outPath = o.out || path.join(ROOT, 'bench/results', `cpu_samples_${date}.json`);
  const samples = [];
  const started = new Date().toISOString();
  for (let s = 0; s < o.samples; ++s) {
    const order = o.threads.map((_, i) => o.threads[(i + s) % o.threads.length]);
    for (const t of order) {
      const load = os.loadavg()[0];
      const r = sampleOnce(o, t);
      samples.push({ round: s, threads: t, time: new Date().toISOString(), load1: load, ...r });
      process.stderr.write(`round ${s + 1}/${o.samples} threads ${t}: softmax ${r.softmax.mem_frac.toFixed(3)}, ` +
        `layer_norm+gelu ${r.layer_norm_gelu.mem_frac.toFixed(3)} (load ${load.toFixed(2)})\n`);
    }
    if (s + 1 < o.samples) spawnSync('sleep', [String(o.gap)]);
  }
  const summary = {};
  const lines = ['| kernel | threads | rounds | mem_frac median | min | max | rounds ≥ 0.70 | kernel ms (median) | memcpy ms (median) |',
    '|---|---|---|---|---|---|---|---|---|'];
  for (const kernel of ['softmax', 'layer_norm_gelu']) {
    for (const t of o.threads) {
      const mine = samples.filter((x) => x.threads === t).map((x) => x[kernel]);
      const f = mine.map((x) => x.mem_frac);
      const key = `${kernel}/t${t}`;
      summary[key] = {
        rounds: f.length, mem_frac_median: upperMedian(f), mem_frac_min: Math.min(...f), mem_frac_max: Math.max(...f),
        rounds_at_least_0_70: f.filter((x) => x >= 0.70).length,
        kernel_ms_median: upperMedian(mine.map((x) => x.kernel_median_ms)), memcpy_ms_median: upperMedian(mine.map((x) => x.memcpy_median_ms)),
      };
      const m = summary[key];
      lines.push(`| ${kernel} | ${t} | ${m.rounds} | ${m.mem_frac_median.toFixed(3)} | ${m.mem_frac_min.toFixed(3)} | ` +
        `${m.mem_frac_max.toFixed(3)} | ${m.rounds_at_least_0_70} | ${m.kernel_ms_median.toFixed(2)} | ${m.memcpy_ms_median.toFixed(2)} |`);
    }
  }
  const doc = {
    what: `softmax and layer_norm+gelu on ${o.rows} x 4096 f32 vs the same-run memcpy peer, sampled over time`,
    ...gitState(), started, finished: new Date().toISOString(), machine: machine(),
    method: { samples: o.samples, gap_s: o.gap, threads: o.threads, rows: o.rows, repetitions_per_sample: o.reps, wait_policy: 'passive' },
    summary, samples,
  };
  fs.writeFileSync(outPath, JSON.stringify(doc, null, 1) + '\n');
  process.stdout.write(lines.join('\n') + `\n\nwrote ${path.relative(process.cwd(), outPath)}\n`);
}

main();
