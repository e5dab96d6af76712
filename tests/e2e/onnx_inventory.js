#!/usr/bin/env node
'use strict';
// Op inventory of an ONNX model: opsets, inputs/outputs, op types with counts, and the distinct ways
// each op is used (attribute values, how many inputs, where each input comes from). Used to write
// docs/models.md; handy when a new model arrives.
//
// Usage: node tests/e2e/onnx_inventory.js MODEL.onnx [--json] [--max-variants N]
//   Input kinds in a signature: init = initializer, const = Constant node output, in = graph input,
//   shape = computed only from shapes/constants (Shape, Size, ConstantOfShape, ... chains), x = data,
//   a trailing ^ = captured from an enclosing graph (inside If bodies), '' = omitted optional input.
//   Small integer constants (and small float ones for Resize/Pad/Clip/Pow/...) show their value.
const fs = require('fs');
const onnx = require('./onnx_proto');

const args = process.argv.slice(2);
const asJson = args.includes('--json');
const mvIdx = args.indexOf('--max-variants');
const maxVariants = mvIdx >= 0 ? Number(args[mvIdx + 1]) : 12;
const file = args.find((a, i) => !a.startsWith('--') && (mvIdx < 0 || i !== mvIdx + 1));
if (!file) {
  console.error('usage: onnx_inventory.js MODEL.onnx [--json] [--max-variants N]');
  process.exit(2);
}

const m = onnx.model(fs.readFileSync(file));

const fmtShape = (s) => (s ? `[${s.join(', ')}]` : '?');
function fmtValue(v) {
  if (v === undefined) return 'undefined';
  if (typeof v === 'bigint') return v.toString();
  if (Array.isArray(v)) {
    if (v.length && typeof v[0] === 'object' && v[0] && v[0].dims) return `${v.length} tensors`;
    if (v.length && typeof v[0] === 'object' && v[0] && v[0].node) return `${v.length} graphs`;
    return `[${v.map(fmtValue).join(',')}]`;
  }
  if (typeof v === 'number') return Number.isInteger(v) ? String(v) : String(parseFloat(v.toPrecision(7)));
  if (typeof v === 'string') return JSON.stringify(v);
  if (v && v.dims) {  // tensor
    const vals = onnx.tensorValues(v);
    const n = v.dims.reduce((a, b) => a * Number(b), 1);
    return `${v.dtype}${fmtShape(v.dims)}` + (vals && n <= 8 ? `=${fmtValue(vals)}` : '');
  }
  if (v && v.node) return `graph(${v.node.length} nodes)`;
  return String(v);
}

// Attributes whose value is mostly per-node noise (weights layout) are summarized by presence only.
const NOISY = new Set([]);

const SHAPE_OPS = new Set(['Shape', 'Size', 'ConstantOfShape', 'Constant']);

// Ops whose small constant inputs are shown by value in the signatures (besides any integer constant).
const SHOW_FLOAT_CONSTS = new Set(['Resize', 'Pad', 'Clip', 'Pow', 'ConstantOfShape', 'Equal', 'Upsample']);

function analyzeGraph(g, outer, path, acc) {
  // value name → init | const | in | shape | x; a value from an enclosing graph keeps its kind, marked ^
  const kind = new Map();
  const constVal = new Map(outer.constVal);  // value name → small TensorProto
  for (const t of g.initializer) {
    kind.set(t.name, 'init');
    if (t.dims.reduce((a, b) => a * Number(b), 1) <= 8) constVal.set(t.name, t);
  }
  for (const i of g.input) if (!kind.has(i.name)) kind.set(i.name, 'in');
  const kindOf = (i) => {
    if (i === '') return '';
    if (kind.has(i)) return kind.get(i);
    if (outer.kind.has(i)) return `${outer.kind.get(i).replace(/\^$/, '')}^`;
    return '?';
  };
  const showConst = (opType, i, k) => {
    const t = constVal.get(i);
    if (!t || !/^(const|init)\^?$/.test(k)) return k;
    const isInt = ['i64', 'i32', 'bool', 'i8', 'u8'].includes(t.dtype);
    if (!isInt && !SHOW_FLOAT_CONSTS.has(opType)) return k;
    const vals = onnx.tensorValues(t);
    return vals ? `${k}=${t.dims.length ? fmtValue(vals) : fmtValue(vals[0])}` : k;
  };
  for (const n of g.node) {
    const inKinds = n.input.map(kindOf);
    const base = (k) => k.replace(/\^$/, '');
    let outKind;
    if (n.opType === 'Constant') outKind = 'const';
    else if (n.opType === 'Shape' || n.opType === 'Size') outKind = 'shape';
    else if (n.opType === 'If' || n.opType === 'Loop' || n.opType === 'Scan') outKind = 'x';
    else if (inKinds.every((k) => ['', 'const', 'init', 'shape'].includes(base(k)))) {
      outKind = inKinds.some((k) => base(k) === 'shape') ? 'shape' : 'const';
    } else outKind = 'x';
    for (const o of n.output) kind.set(o, outKind);

    const key = (n.domain ? `${n.domain}::` : '') + n.opType;
    let op = acc.ops.get(key);
    if (!op) { op = { opType: n.opType, domain: n.domain, count: 0, variants: new Map(), where: new Set() }; acc.ops.set(key, op); }
    op.count++;
    op.where.add(path);
    const attrs = n.attribute.map((a) => {
      if (n.opType === 'Constant') return `${a.name}=${fmtValue(a.value)}`;
      if (a.type === 'g') return `${a.name}=graph`;
      if (NOISY.has(a.name)) return a.name;
      return `${a.name}=${fmtValue(a.value)}`;
    }).sort();
    let sig;
    if (n.opType === 'Constant') {
      const t = n.attribute[0] && n.attribute[0].t;
      sig = t ? `${t.dtype} rank ${t.dims.length}` + (t.dims.reduce((a, b) => a * Number(b), 1) <= 8 ? ' (small)' : '') : attrs.join(' ');
    } else {
      sig = `in=[${inKinds.map((k, j) => showConst(n.opType, n.input[j], k)).join(',')}] ${attrs.join(' ')}`.trim();
    }
    op.variants.set(sig, (op.variants.get(sig) || 0) + 1);

    for (const a of n.attribute) {
      const subs = a.type === 'g' ? [a.g] : a.type === 'graphs' ? a.graphs : [];
      for (const sg of subs) {
        const inner = { kind: new Map([...outer.kind, ...kind]), constVal };
        acc.subgraphs.push({ path: `${path}/${n.opType}:${n.name || n.output[0]}.${a.name}`, graph: sg,
          cond: n.opType === 'If' ? `${n.input[0]} (${inKinds[0]})` : undefined });
        analyzeGraph(sg, inner, `${path}/${n.opType}.${a.name}`, acc);
      }
    }
    if (n.opType === 'Constant' && n.attribute[0] && n.attribute[0].t &&
        n.attribute[0].t.dims.reduce((a, b) => a * Number(b), 1) <= 8) constVal.set(n.output[0], n.attribute[0].t);
  }
}

const acc = { ops: new Map(), subgraphs: [] };
analyzeGraph(m.graph, { kind: new Map(), constVal: new Map() }, 'main', acc);

const g = m.graph;
const initNames = new Set(g.initializer.map((t) => t.name));
const initBytes = g.initializer.reduce((s, t) => s + (t.rawData ? t.rawData.length : 0) +
  4 * (t.floatData.length + t.int32Data.length) + 8 * (t.int64Data.length + t.doubleData.length), 0);
const report = {
  file,
  irVersion: m.irVersion,
  producer: `${m.producerName} ${m.producerVersion}`.trim(),
  opsets: m.opsetImport.map((o) => `${o.domain || 'ai.onnx'}:${o.version}`),
  graphName: g.name,
  inputs: g.input.filter((i) => !initNames.has(i.name)).map((i) => ({ name: i.name, dtype: i.dtype, shape: i.shape })),
  outputs: g.output.map((o) => ({ name: o.name, dtype: o.dtype, shape: o.shape })),
  initializers: { count: g.initializer.length, bytes: initBytes,
    dtypes: [...new Set(g.initializer.map((t) => t.dtype))] },
  nodes: g.node.length,
  ops: [...acc.ops.values()].sort((a, b) => a.opType.localeCompare(b.opType)).map((o) => ({
    opType: o.opType, domain: o.domain, count: o.count, where: [...o.where],
    variants: [...o.variants.entries()].sort((a, b) => b[1] - a[1]).map(([sig, count]) => ({ sig, count })),
  })),
  subgraphs: acc.subgraphs.map((s) => ({ path: s.path, cond: s.cond, nodes: s.graph.node.length,
    ops: s.graph.node.map((n) => n.opType),
    inputs: s.graph.input.map((i) => i.name), outputs: s.graph.output.map((o) => `${o.name}:${o.dtype}${fmtShape(o.shape)}`) })),
};

if (asJson) {
  console.log(JSON.stringify(report, (k, v) => (typeof v === 'bigint' ? v.toString() : v), 2));
  process.exit(0);
}
console.log(`# ${file}`);
console.log(`ir_version ${report.irVersion}, producer "${report.producer}", opsets ${report.opsets.join(' ')}, graph "${report.graphName}"`);
console.log(`initializers: ${report.initializers.count} (${report.initializers.bytes} bytes, ${report.initializers.dtypes.join(',')}); top-level nodes: ${report.nodes}`);
for (const i of report.inputs) console.log(`input  ${i.name}: ${i.dtype}${fmtShape(i.shape)}`);
for (const o of report.outputs) console.log(`output ${o.name}: ${o.dtype}${fmtShape(o.shape)}`);
console.log('ops:');
for (const o of report.ops) {
  const where = o.where.length === 1 && o.where[0] === 'main' ? '' : `  (in: ${o.where.join(', ')})`;
  console.log(`  ${o.domain ? o.domain + '::' : ''}${o.opType} x${o.count}${where}`);
  for (const v of o.variants.slice(0, maxVariants)) console.log(`      ${v.count} × ${v.sig}`);
  if (o.variants.length > maxVariants) console.log(`      ... ${o.variants.length - maxVariants} more variants`);
}
for (const s of report.subgraphs) {
  console.log(`subgraph ${s.path}${s.cond ? ` cond=${s.cond}` : ''}: ${s.nodes} nodes; outputs ${s.outputs.join(' ')}`);
  console.log(`    ops: ${s.ops.join(' ')}`);
}
