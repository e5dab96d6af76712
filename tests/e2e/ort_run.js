#!/usr/bin/env node
'use strict';
// Runs an ONNX model with the reference runtime (onnxruntime-node, CPU) and writes every output as
// OUTDIR/<output name>.npy, so Protean's results can be compared against it. Prints one JSON object to
// stdout: {model, ort_version, threads, inputs, shape, outputs, repeat, warmup, median_ms, min_ms,
// mean_ms, times_ms, max_rss_mb}.
//
// Usage: node tests/e2e/ort_run.js MODEL.onnx OUTDIR [NAME=FILE.npy ...] [options]
//   NAME=FILE.npy             an input read from a .npy file (f32, f64, f16, i64, i32, i8, u8, bool)
//   --random NAME=[DT:]DIMS   a seeded random input, DIMS like 1x3x48x320 ('scalar' or '' for rank 0);
//                             DT (f32|f16|f64|i64|i32|bool) defaults to the model's input type.
//                             Floats are uniform in --range (default -1,1), ints in [0, 10), bools 50/50.
//   --const NAME=DT:DIMS:V    an input filled with the value V, e.g. --const sr=i64:scalar:16000
//   --seed N                  seed of the random inputs (default 0); same seed → same bytes everywhere
//   --range LO,HI             range of random floats (default -1,1)
//   --threads N               intra-op threads (default: ORT's choice); inter-op is always 1
//   --repeat N                timed runs (default 1); outputs come from the last one
//   --warmup N                untimed runs first (default 1 if --repeat > 1, else 0)
//   --ort PATH                onnxruntime-node package dir (or the node_modules holding it); default:
//                             require('onnxruntime-node') via NODE_PATH, then
//                             ${PROTEAN_CACHE_DIR:-~/.cache/protean}/node/node_modules
//   --no-opt                  disable ORT graph optimizations (to tell a fusion's rounding from a bug)
// Every input actually used (random and const ones too) is also written to OUTDIR/inputs/<name>.npy,
// so the C++ side can load exactly the same bytes. Output names are sanitized for file names
// ('/' and other unsafe characters → '_'); the JSON maps each output name to its file.
const fs = require('fs');
const path = require('path');
const npy = require('./npy');
const ortSession = require('./ort_session');

function die(msg) {
  process.stderr.write(`ort_run: error: ${msg}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const o = { positional: [], files: [], random: [], consts: [], seed: 0, range: [-1, 1], threads: 0, repeat: 1,
    warmup: null, ort: null, opt: true };
  const need = (i, flag) => {
    if (i + 1 >= argv.length) die(`${flag} needs a value`);
    return argv[i + 1];
  };
  const int = (v, flag, min) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) die(`${flag} expects an integer >= ${min}, got '${v}'`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    switch (a) {
      case '--random': o.random.push(need(i, a)); i++; break;
      case '--const': o.consts.push(need(i, a)); i++; break;
      case '--seed': o.seed = int(need(i, a), a, 0); i++; break;
      case '--range': {
        const r = need(i, a).split(',').map(Number); i++;
        if (r.length !== 2 || !r.every(Number.isFinite) || !(r[0] < r[1])) die(`--range expects LO,HI with LO < HI`);
        o.range = r; break;
      }
      case '--threads': o.threads = int(need(i, a), a, 1); i++; break;
      case '--repeat': o.repeat = int(need(i, a), a, 1); i++; break;
      case '--warmup': o.warmup = int(need(i, a), a, 0); i++; break;
      case '--ort': o.ort = need(i, a); i++; break;
      case '--no-opt': o.opt = false; break;
      case '-h': case '--help': {
        const src = fs.readFileSync(__filename, 'utf8').split('\n');
        process.stdout.write(src.filter((l) => l.startsWith('//')).map((l) => l.slice(3)).join('\n') + '\n');
        process.exit(0);
      }
      // fall through
      default:
        if (a.startsWith('--')) die(`unknown option ${a} (see --help)`);
        if (o.positional.length >= 2 && a.includes('=')) o.files.push(a); else o.positional.push(a);
    }
  }
  if (o.positional.length !== 2) die('usage: ort_run.js MODEL.onnx OUTDIR [NAME=FILE.npy ...] [options] (see --help)');
  if (o.warmup === null) o.warmup = o.repeat > 1 ? 1 : 0;
  return o;
}

// ONNX Runtime tensor type names ↔ our dtype names.
const ORT_TYPE = { f32: 'float32', f64: 'float64', f16: 'float16', i64: 'int64', i32: 'int32', i16: 'int16',
  i8: 'int8', u8: 'uint8', u16: 'uint16', u32: 'uint32', u64: 'uint64', bool: 'bool' };
const FROM_ORT = Object.fromEntries(Object.entries(ORT_TYPE).map(([k, v]) => [v, k]));

function parseDims(text, what) {
  if (text === '' || text === 'scalar') return [];
  const dims = text.split('x').map((s) => Number(s));
  if (!dims.every((d) => Number.isInteger(d) && d >= 0)) die(`${what}: bad dims '${text}' (expected e.g. 1x3x48x320)`);
  return dims;
}

// Seeded generator: splitmix64 (exact in BigInt, identical on every platform).
function makeRng(seed) {
  let s = BigInt.asUintN(64, BigInt(seed));
  return () => {
    s = BigInt.asUintN(64, s + 0x9e3779b97f4a7c15n);
    let z = s;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    z ^= z >> 31n;
    return Number(z >> 11n) / 2 ** 53;  // uniform in [0, 1)
  };
}

function randomArray(dtype, shape, rng, [lo, hi]) {
  const spec = npy.DTYPES[dtype];
  if (!spec) die(`--random: unsupported dtype '${dtype}'`);
  const n = npy.numel(shape);
  const data = new spec[2](n);
  for (let i = 0; i < n; i++) {
    const u = rng();
    if (dtype === 'f32' || dtype === 'f64') data[i] = lo + (hi - lo) * u;
    else if (dtype === 'f16') data[i] = npy.floatToHalf(lo + (hi - lo) * u);
    else if (dtype === 'bool') data[i] = u < 0.5 ? 0 : 1;
    else if (dtype === 'i64' || dtype === 'u64') data[i] = BigInt(Math.floor(u * 10));
    else data[i] = Math.floor(u * 10);
  }
  return { dtype, shape, data };
}

function constArray(dtype, shape, value) {
  const spec = npy.DTYPES[dtype];
  if (!spec) die(`--const: unsupported dtype '${dtype}'`);
  const n = npy.numel(shape);
  const data = new spec[2](n);
  let v;
  if (dtype === 'i64' || dtype === 'u64') v = BigInt(value);
  else if (dtype === 'f16') v = npy.floatToHalf(Number(value));
  else if (dtype === 'bool') v = value === 'true' || Number(value) ? 1 : 0;
  else v = Number(value);
  data.fill(v);
  return { dtype, shape, data };
}

function safeName(name) { return name.replace(/[^A-Za-z0-9._-]/g, '_'); }

function stats(arr) {
  const n = arr.data.length;
  if (n === 0) return {};
  let min = Infinity, max = -Infinity, sum = 0, nonfinite = 0;
  for (let i = 0; i < n; i++) {
    let v = arr.data[i];
    if (typeof v === 'bigint') v = Number(v);
    else if (arr.dtype === 'f16') v = npy.halfToFloat(v);
    if (!Number.isFinite(v)) { nonfinite++; continue; }
    if (v < min) min = v;
    if (v > max) max = v;
    sum += v;
  }
  const out = { min, max, mean: sum / Math.max(1, n - nonfinite) };
  if (nonfinite) out.nonfinite = nonfinite;
  return out;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const [modelPath, outDir] = o.positional;
  if (!fs.existsSync(modelPath)) die(`${modelPath}: model file not found`);
  const ort = ortSession.load(o.ort, die);
  const session = await ortSession.open(ort, modelPath, { threads: o.threads, optimize: o.opt }, die);
  const meta = Object.fromEntries((session.inputMetadata || []).map((m) => [m.name, m]));
  const known = new Set(session.inputNames);
  const checkName = (name, flag) => {
    if (!known.has(name)) die(`${flag}: the model has no input '${name}' (inputs: ${session.inputNames.join(', ')})`);
  };

  const inputs = {};  // name → {dtype, shape, data}
  for (const f of o.files) {
    const eq = f.indexOf('=');
    const name = f.slice(0, eq);
    checkName(name, f);
    try { inputs[name] = npy.read(f.slice(eq + 1)); } catch (e) { die(e.message); }
  }
  const rng = makeRng(o.seed);
  for (const r of o.random) {  // in command-line order, so the stream is reproducible
    const eq = r.indexOf('=');
    if (eq < 0) die(`--random expects NAME=[DT:]DIMS, got '${r}'`);
    const name = r.slice(0, eq);
    checkName(name, '--random');
    let spec = r.slice(eq + 1), dtype = null;
    if (spec.includes(':')) [dtype, spec] = spec.split(':');
    if (!dtype) {
      const t = meta[name] && meta[name].type;
      dtype = FROM_ORT[t];
      if (!dtype) die(`--random ${name}: cannot tell the model's input type (${t}); write e.g. ${name}=f32:${spec}`);
    }
    inputs[name] = randomArray(dtype, parseDims(spec, `--random ${name}`), rng, o.range);
  }
  for (const c of o.consts) {
    const m = /^([^=]+)=([a-z0-9]+):([0-9x]*|scalar):(.+)$/.exec(c);
    if (!m) die(`--const expects NAME=DT:DIMS:VALUE (e.g. sr=i64:scalar:16000), got '${c}'`);
    checkName(m[1], '--const');
    inputs[m[1]] = constArray(m[2], parseDims(m[3], `--const ${m[1]}`), m[4]);
  }
  const missing = session.inputNames.filter((n) => !(n in inputs));
  if (missing.length) {
    const desc = missing.map((n) => (meta[n] ? `${n}: ${meta[n].type}[${meta[n].shape.map((d) => d === '' ? '?' : d)}]` : n));
    die(`missing inputs: ${desc.join(', ')}`);
  }

  fs.mkdirSync(path.join(outDir, 'inputs'), { recursive: true });
  const feeds = {};
  for (const [name, arr] of Object.entries(inputs)) {
    npy.write(path.join(outDir, 'inputs', `${safeName(name)}.npy`), arr);
    const type = ORT_TYPE[arr.dtype];
    if (!type) die(`input ${name}: dtype ${arr.dtype} not supported by onnxruntime-node`);
    feeds[name] = new ort.Tensor(type, arr.data, arr.shape);
  }

  const times = [];
  let results;
  for (let i = 0; i < o.warmup + o.repeat; i++) {
    const t0 = process.hrtime.bigint();
    try {
      results = await session.run(feeds);
    } catch (e) {
      die(`ONNX Runtime failed to run ${modelPath}: ${e.message}`);
    }
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    if (i >= o.warmup) times.push(ms);
  }
  const sorted = [...times].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const median = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;

  const outputs = {};
  for (const name of session.outputNames) {
    const t = results[name];
    const dtype = FROM_ORT[t.type];
    if (!dtype) die(`output ${name}: type ${t.type} cannot be written as .npy`);
    const arr = { dtype, shape: t.dims.map(Number), data: t.data };
    const file = path.join(outDir, `${safeName(name)}.npy`);
    npy.write(file, arr);
    outputs[name] = { dtype, shape: arr.shape, file, ...stats(arr) };
  }
  const round = (x) => Math.round(x * 1000) / 1000;
  const report = {
    model: modelPath,
    ort_version: ortSession.version(ort, o.ort) || undefined,
    threads: o.threads || 'default',
    seed: o.seed,
    inputs: Object.fromEntries(Object.entries(inputs).map(([n, a]) => [n, { dtype: a.dtype, shape: a.shape,
      file: path.join(outDir, 'inputs', `${safeName(n)}.npy`) }])),
    shape: Object.fromEntries(Object.entries(inputs).map(([n, a]) => [n, a.shape])),
    outputs,
    repeat: o.repeat,
    warmup: o.warmup,
    median_ms: round(median),
    min_ms: round(sorted[0]),
    mean_ms: round(times.reduce((a, b) => a + b, 0) / times.length),
    times_ms: times.map(round),
    max_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024),
  };
  process.stdout.write(JSON.stringify(report, null, 2) + '\n');
}

main().catch((e) => die(e.stack || String(e)));
