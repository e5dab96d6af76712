#!/usr/bin/env node
'use strict';
// Times ONNX Runtime (onnxruntime-node, CPU execution provider) on one model over several input shapes
// in one process, the way bench/ocr_vs_ort.js times Protean: one session, per shape `--warmup` untimed
// runs then `--repeat` timed runs. Prints one JSON object:
//   {model, ort_version, threads, graph_optimization_level,
//    shapes: {"1x3x48x320": {times_ms, median_ms, cpu_ms, median_cpu_ms}}, max_rss_mb}
// cpu_ms: CPU time of the whole process (all threads, user + system) during each run.
// Usage: node bench/ort_bench.js MODEL.onnx --input x --shapes 1x3x48x160,1x3x48x320 [--threads N]
//          [--repeat N] [--warmup N] [--ort PATH]
// Inputs are uniform in [-1, 1) from a fixed-seed generator (latency does not depend on the values).
// Session options: intraOpNumThreads = --threads, interOpNumThreads = 1, sequential execution, graph
// optimizations left at ONNX Runtime's default (all).
const ortSession = require('../tests/e2e/ort_session');

const { dieFor, median } = require('./bench_util');

const die = dieFor('ort_bench');

function parseArgs(argv) {
  const o = { model: null, input: 'x', shapes: [], threads: 1, repeat: 10, warmup: 3, ort: null };
  const need = (i) => {
    if (i + 1 >= argv.length) die(`${argv[i]} needs a value`);
    return argv[i + 1];
  };
  const int = (v, flag, min) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) die(`${flag} expects an integer >= ${min}, got '${v}'`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--input') o.input = need(i++);
    else if (a === '--shapes') o.shapes = need(i++).split(',');
    else if (a === '--threads') o.threads = int(need(i++), a, 1);
    else if (a === '--repeat') o.repeat = int(need(i++), a, 1);
    else if (a === '--warmup') o.warmup = int(need(i++), a, 0);
    else if (a === '--ort') o.ort = need(i++);
    else if (a.startsWith('--')) die(`unknown option ${a}`);
    else if (o.model === null) o.model = a;
    else die(`unexpected argument '${a}'`);
  }
  if (!o.model) die('usage: ort_bench.js MODEL.onnx --shapes DIMS[,DIMS...] [--input NAME] [--threads N] ...');
  if (o.shapes.length === 0) die('--shapes is required');
  for (const s of o.shapes)
    if (!/^\d+(x\d+)*$/.test(s)) die(`--shapes: '${s}' is not like 1x3x48x320`);
  return o;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const ort = ortSession.load(o.ort, die);
  const session = await ortSession.open(ort, o.model, { threads: o.threads }, die);
  if (!session.inputNames.includes(o.input))
    die(`--input: the model has no input '${o.input}' (inputs: ${session.inputNames.join(', ')})`);
  let state = 0x9e3779b9;  // xorshift32: deterministic inputs
  const next = () => {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state / 4294967296 * 2 - 1;
  };
  const shapes = {};
  for (const s of o.shapes) {
    const dims = s.split('x').map(Number);
    const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = next();
    const feeds = { [o.input]: new ort.Tensor('float32', data, dims) };
    for (let i = 0; i < o.warmup; i++) await session.run(feeds);
    const times = [], cpu = [];
    for (let i = 0; i < o.repeat; i++) {
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      await session.run(feeds);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      const c = process.cpuUsage(c0);
      cpu.push((c.user + c.system) / 1e3);
    }
    shapes[s] = { times_ms: times, median_ms: median(times), cpu_ms: cpu, median_cpu_ms: median(cpu) };
  }
  const version = ortSession.version(ort, o.ort);
  process.stdout.write(JSON.stringify({ model: o.model, ort_version: version, threads: o.threads,
    graph_optimization_level: 'default (all)', shapes, max_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024) })
    + '\n');
}

main().catch((e) => die(e.stack || String(e)));
