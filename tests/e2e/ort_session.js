'use strict';
// The one place that loads ONNX Runtime (onnxruntime-node, CPU execution provider) and opens a session
// for Protean's reference runs (tests/e2e/ort_run.js) and benchmarks (bench/ort_bench.js), so both
// measure the same configuration.
//
//   const ortSession = require('./ort_session');
//   const ort = ortSession.load(explicitPath, die);          // die(msg) is called when nothing loads
//   const session = await ortSession.open(ort, model, { threads: 2, optimize: true }, die);
//   ortSession.version(ort, explicitPath)                    // '1.30.0' or null
//
// Session options: CPU execution provider, interOpNumThreads = 1, sequential execution,
// intraOpNumThreads = threads (ORT's own choice when threads is 0 or absent), graph optimizations
// 'all' (ORT's default) or 'disabled' with optimize = false.
const path = require('path');
const os = require('os');

/// Where onnxruntime-node is looked for: the explicit path (a package dir or the node_modules holding
/// it), else require() via NODE_PATH, then the cache that scripts/fetch_models.sh fills.
function candidates(explicit) {
  if (explicit) return [explicit, path.join(explicit, 'onnxruntime-node')];
  const cache = process.env.PROTEAN_ORT_CACHE_DIR || process.env.PROTEAN_CACHE_DIR ||
                path.join(os.homedir(), '.cache', 'protean');
  return ['onnxruntime-node', path.join(cache, 'node', 'node_modules', 'onnxruntime-node')];
}

function load(explicit, die) {
  const errors = [];
  for (const t of candidates(explicit)) {
    try { return require(t); } catch (e) { errors.push(`${t}: ${e.message.split('\n')[0]}`); }
  }
  die(`cannot load onnxruntime-node (run scripts/fetch_models.sh, or pass --ort / set NODE_PATH):\n  ${errors.join('\n  ')}`);
  return null;
}

function sessionOptions({ threads = 0, optimize = true } = {}) {
  const opts = { executionProviders: ['cpu'], interOpNumThreads: 1, executionMode: 'sequential',
    graphOptimizationLevel: optimize ? 'all' : 'disabled' };
  if (threads) opts.intraOpNumThreads = threads;
  return opts;
}

async function open(ort, model, options, die) {
  try {
    return await ort.InferenceSession.create(model, sessionOptions(options));
  } catch (e) {
    die(`${model}: ONNX Runtime cannot load the model: ${e.message}`);
    return null;
  }
}

/// The loaded package's version: its package.json, else what ort.env reports.
function version(ort, explicit) {
  for (const t of candidates(explicit)) {
    try { return require(path.join(path.dirname(require.resolve(t)), '..', 'package.json')).version; }
    catch (e) { /* next */ }
  }
  return ort && ort.env && ort.env.versions ? ort.env.versions.node || null : null;
}

module.exports = { load, open, version, sessionOptions };
