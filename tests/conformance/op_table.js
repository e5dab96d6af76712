#!/usr/bin/env node
'use strict';
// Per-op counts for docs/onnx.md's op table, from the JSON files of conformance runs: for each op type
// (every node of every graph and subgraph of the model, with its domain), how many of the node suite's
// tests that use it pass, out of those not skipped, on each run given. `_expanded` variants (the op
// spelled out as its function body) are left out, so a test counts for the op it is named after and
// for the ops its model uses. A test fails for its first missing feature, which is not always this op's.
//
// Usage: node tests/conformance/op_table.js [--data DIR] [--suite node] RUN.json...
//   RUN.json: `protean_conformance --json` or `ort_conformance.js --json` output; the column is named
//   after the file (its basename without .json).
// Prints one Markdown row per op: | op | domain | pass/n per run |, and the failing tests per op with
// their reasons from the first run when --why is given.
const fs = require('fs');
const path = require('path');
const proto = require('../e2e/onnx_proto');

const args = process.argv.slice(2);
let data = '/usr/share/libonnx-testdata/data';
let suite = 'node';
let why = false;
const runs = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--data') data = args[++i];
  else if (args[i] === '--suite') suite = args[++i];
  else if (args[i] === '--why') why = true;
  else runs.push(args[i]);
}
if (!runs.length) {
  console.error('usage: op_table.js [--data DIR] [--suite node] [--why] RUN.json...');
  process.exit(2);
}

function opsOf(g, out) {
  for (const n of g.node) {
    out.add(`${n.domain || ''}\t${n.opType}`);
    for (const a of n.attribute) {
      if (a.g) opsOf(a.g, out);
      for (const sub of a.graphs) opsOf(sub, out);
    }
  }
  return out;
}

const outcomes = runs.map((f) => {
  const j = JSON.parse(fs.readFileSync(f, 'utf8'));
  const m = new Map();
  for (const t of j.tests) m.set(t.id, t);
  return { name: path.basename(f, '.json'), tests: m };
});

const perOp = new Map();  // op -> [{id}]
const dir = path.join(data, suite);
for (const name of fs.readdirSync(dir).sort()) {
  if (name.endsWith('_expanded')) continue;
  const file = path.join(dir, name, 'model.onnx');
  if (!fs.existsSync(file)) continue;
  const m = proto.model(fs.readFileSync(file));
  for (const op of opsOf(m.graph, new Set())) {
    if (!perOp.has(op)) perOp.set(op, []);
    perOp.get(op).push(`${suite}/${name}`);
  }
}

console.log(`| op | domain | ${outcomes.map((o) => o.name).join(' | ')} |`);
console.log(`|---|---|${outcomes.map(() => '---').join('|')}|`);
for (const op of [...perOp.keys()].sort((a, b) => a.split('\t')[1].localeCompare(b.split('\t')[1]))) {
  const [domain, type] = op.split('\t');
  const cells = outcomes.map((o) => {
    let pass = 0, n = 0;
    for (const id of perOp.get(op)) {
      const t = o.tests.get(id);
      if (!t || t.outcome === 'skipped') continue;
      ++n;
      if (t.outcome === 'pass') ++pass;
    }
    return n ? `${pass}/${n}` : '-';
  });
  console.log(`| ${type} | ${domain || 'ai.onnx'} | ${cells.join(' | ')} |`);
  if (why) {
    for (const id of perOp.get(op)) {
      const t = outcomes[0].tests.get(id);
      if (t && t.outcome !== 'pass' && t.outcome !== 'skipped')
        console.log(`    ${t.outcome} ${id}: ${(t.reason || '').slice(0, 200)}`);
    }
  }
}
