#!/usr/bin/env node
'use strict';
// ONNX Runtime (onnxruntime-node, CPU) on ONNX's backend test data, classified exactly as
// protean_conformance classifies Protean's runs, so both pass rates come from the same data, the same
// skip rule and the same tolerance:
//   pass / wrong (dtype, shape or values differ: |got - want| <= atol + rtol*|want|, rtol 1e-3,
//   atol 1e-7, NaN == NaN, integers exactly) / error (ORT refused the model or the run) / skipped
//   (a sequence, map or optional-of-non-tensor input or output, or a string tensor; an optional tensor
//   is read from its OptionalProto file and an empty one left out of the feeds).
//
// Usage: node tests/conformance/ort_conformance.js [--data DIR] [--suite NAME ...] [--threads N]
//                                                  [--json FILE] [--verbose] [--ort PATH]
// Default data: /usr/share/libonnx-testdata/data, suites node pytorch-converted pytorch-operator simple.
const fs = require('fs');
const path = require('path');
const proto = require('../e2e/onnx_proto');
const ortSession = require('../e2e/ort_session');

function die(msg) {
  process.stderr.write(`ort_conformance: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const a = { data: '/usr/share/libonnx-testdata/data', suites: [], threads: 1, json: null, verbose: false, ort: null };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const val = () => { if (i + 1 >= argv.length) die(`missing value after ${k}`); return argv[++i]; };
    if (k === '--data') a.data = val();
    else if (k === '--suite') a.suites.push(val());
    else if (k === '--threads') a.threads = Number(val());
    else if (k === '--json') a.json = val();
    else if (k === '--ort') a.ort = val();
    else if (k === '--verbose') a.verbose = true;
    else die(`unknown argument ${k}`);
  }
  if (!a.suites.length) a.suites = ['node', 'pytorch-converted', 'pytorch-operator', 'simple'];
  return a;
}

const ORT_TYPES = { f32: 'float32', f64: 'float64', i64: 'int64', i32: 'int32', i16: 'int16', i8: 'int8',
  u8: 'uint8', u16: 'uint16', u32: 'uint32', u64: 'uint64', bool: 'bool', f16: 'float16' };
const ARRAYS = { float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array,
  int16: Int16Array, int8: Int8Array, uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array,
  uint64: BigUint64Array, bool: Uint8Array, float16: Uint16Array };

// TensorProto bytes → ort.Tensor.
function toOrt(ort, buf, what) {
  const t = proto.tensor(buf);
  const type = ORT_TYPES[t.dtype];
  if (!type) throw new Error(`${what}: element type ${t.dtype} not handled here`);
  const dims = t.dims.map(Number);
  const n = dims.reduce((x, y) => x * y, 1);
  const Arr = ARRAYS[type];
  let data;
  if (t.rawData) {
    const copy = Buffer.from(t.rawData);  // aligned copy
    data = new Arr(copy.buffer, copy.byteOffset, n);
    if (Arr.BYTES_PER_ELEMENT > 1) data = Arr.from(data);
  } else if (t.dtype === 'f32') data = Float32Array.from(t.floatData);
  else if (t.dtype === 'f64') data = Float64Array.from(t.doubleData);
  else if (t.dtype === 'i64') data = BigInt64Array.from(t.int64Data.map((v) => BigInt(v)));
  else if (t.dtype === 'u64' || t.dtype === 'u32') {
    // uint64_data (field 11) is not kept by onnx_proto.js; such tests carry raw data in practice.
    throw new Error(`${what}: ${t.dtype} without raw data`);
  } else data = Arr.from(t.int32Data.map((v) => (Arr === BigInt64Array ? BigInt(v) : v)));
  if (data.length !== n) throw new Error(`${what}: ${data.length} values for shape [${dims}]`);
  return { tensor: new ort.Tensor(type, data, dims), name: t.name, type, dims };
}

function toNumbers(x) {
  const out = new Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = typeof x[i] === 'bigint' ? x[i] : Number(x[i]);
  return out;
}

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

function compare(got, want, rtol, atol) {
  if (got.type !== want.type) return `dtype ${got.type} (expected ${want.type})`;
  if (got.dims.length !== want.dims.length || got.dims.some((d, i) => Number(d) !== want.dims[i]))
    return `shape [${got.dims}] (expected [${want.dims}])`;
  let a = toNumbers(got.data), b = toNumbers(want.tensor.data);
  if (want.type === 'float16') { a = a.map(halfToFloat); b = b.map(halfToFloat); }
  const floating = ['float32', 'float64', 'float16'].includes(want.type);
  let bad = 0, first = -1;
  for (let i = 0; i < b.length; i++) {
    let ok;
    if (floating) {
      if (Number.isNaN(a[i]) && Number.isNaN(b[i])) ok = true;
      else if (!Number.isFinite(b[i])) ok = a[i] === b[i];
      else ok = Math.abs(a[i] - b[i]) <= atol + rtol * Math.abs(b[i]);
    } else ok = a[i] === b[i];
    if (!ok) { if (first < 0) first = i; bad++; }
  }
  return bad ? `${bad} of ${b.length} values differ; first at ${first}: ${a[first]} (expected ${b[first]})` : '';
}

function skipReason(m) {
  const inits = new Set(m.graph.initializer.map((t) => t.name));
  for (const [list, what] of [[m.graph.input, 'input'], [m.graph.output, 'output']]) {
    for (const vi of list) {
      if (what === 'input' && inits.has(vi.name)) continue;
      if (vi.dtype === 'non-tensor') return `${what} '${vi.name}' is a sequence, map or optional of a non-tensor`;
      if (vi.dtype === 'string') return `${what} '${vi.name}' is a string tensor`;
    }
  }
  return '';
}

function numbered(dir, prefix) {
  const r = [];
  for (let i = 0; fs.existsSync(path.join(dir, `${prefix}_${i}.pb`)); i++) r.push(path.join(dir, `${prefix}_${i}.pb`));
  return r;
}

async function runCase(ort, dir, opts) {
  const model = path.join(dir, 'model.onnx');
  const m = proto.model(fs.readFileSync(model));
  const skip = skipReason(m);
  if (skip) return { outcome: 'skipped', reason: skip };
  let session;
  const t0 = process.hrtime.bigint();
  try {
    session = await ort.InferenceSession.create(model, ortSession.sessionOptions({ threads: opts.threads }));
  } catch (e) {
    return { outcome: 'error', reason: e.message.split('\n')[0] };
  }
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
  const sets = fs.readdirSync(dir).filter((d) => d.startsWith('test_data_set_')).sort();
  let runS = 0;
  for (const [si, set] of sets.entries()) {
    const feeds = {};
    const realInputs = m.graph.input.filter((vi) => !m.graph.initializer.some((t) => t.name === vi.name));
    numbered(path.join(dir, set), 'input').forEach((f, i) => {
      let buf = fs.readFileSync(f);
      if (realInputs[i] && realInputs[i].optional) {
        // An optional input's file is an OptionalProto; the empty optional is left out of the feeds.
        const o = proto.optional(buf);
        if (o.elemType !== 1) return;
        buf = o.tensorValue;
      }
      const t = toOrt(ort, buf, f);
      const name = session.inputNames.includes(t.name) ? t.name : session.inputNames[i];
      feeds[name] = t.tensor;
    });
    let outs;
    const t1 = process.hrtime.bigint();
    try {
      outs = await session.run(feeds);
    } catch (e) {
      return { outcome: 'error', reason: e.message.split('\n')[0], loadS };
    }
    if (si === 0) runS = Number(process.hrtime.bigint() - t1) / 1e9;
    const files = numbered(path.join(dir, set), 'output');
    if (files.length !== session.outputNames.length)
      return { outcome: 'wrong', reason: `${session.outputNames.length} outputs, the test data has ${files.length}` };
    for (const [i, f] of files.entries()) {
      let buf = fs.readFileSync(f);
      const ovi = m.graph.output[i];
      if (ovi && ovi.optional) {
        const o = proto.optional(buf);
        const got = outs[session.outputNames[i]];
        if (o.elemType !== 1) {
          if (got !== undefined && got !== null) return { outcome: 'wrong', reason: `${set}: output ${i}: a tensor, expected the empty optional`, loadS, runS };
          continue;
        }
        buf = o.tensorValue;
      }
      const want = toOrt(ort, buf, f);
      const d = compare(outs[session.outputNames[i]], want, 1e-3, 1e-7);
      if (d) return { outcome: 'wrong', reason: `${set}: output ${i}: ${d}`, loadS, runS };
    }
  }
  return { outcome: 'pass', reason: '', loadS, runS };
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const ort = ortSession.load(a.ort, die);
  const all = [];
  const summary = {};
  for (const suite of a.suites) {
    const sd = path.join(a.data, suite);
    if (!fs.existsSync(sd)) die(`no suite directory ${sd} (install Debian's libonnx-testdata)`);
    const c = { pass: 0, wrong: 0, error: 0, skipped: 0, load_s: 0, run_s: 0 };
    for (const name of fs.readdirSync(sd).sort()) {
      const dir = path.join(sd, name);
      if (!fs.existsSync(path.join(dir, 'model.onnx'))) continue;
      let r;
      try {
        r = await runCase(ort, dir, a);
      } catch (e) {
        r = { outcome: 'error', reason: `runner: ${e.message.split('\n')[0]}` };
      }
      c[r.outcome]++;
      c.load_s += r.loadS || 0;
      c.run_s += r.runS || 0;
      all.push({ id: `${suite}/${name}`, outcome: r.outcome, reason: r.reason });
      if (a.verbose || r.outcome !== 'pass') process.stdout.write(`${r.outcome.padEnd(7)} ${suite}/${name}  ${r.reason}\n`);
    }
    summary[suite] = c;
  }
  process.stdout.write(`\n== ONNX Runtime ${ortSession.version(ort, a.ort)} (CPU, ${a.threads} thread(s)) ==\n`);
  for (const [suite, c] of Object.entries(summary)) {
    const ran = c.pass + c.wrong + c.error;
    process.stdout.write(`${suite.padEnd(18)} pass ${String(c.pass).padStart(4)}  wrong ${String(c.wrong).padStart(3)}  ` +
      `error ${String(c.error).padStart(4)}  skipped ${String(c.skipped).padStart(3)}  | ` +
      `${(ran ? 100 * c.pass / ran : 0).toFixed(1)}% of ${ran} not skipped | load ${c.load_s.toFixed(1)} s, first run ${c.run_s.toFixed(1)} s\n`);
  }
  if (a.json) fs.writeFileSync(a.json, JSON.stringify({ ort_version: ortSession.version(ort, a.ort), summary, tests: all }, null, 1));
}

main().catch((e) => die(e.stack || String(e)));
