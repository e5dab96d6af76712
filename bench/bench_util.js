'use strict';
// Helpers the benchmark scripts share (bench/ocr_vs_ort.js, bench/ort_bench.js,
// bench/kernel_samples.js): error exit, median, the machine and commit a result file records.
const { execFileSync } = require('child_process');
const os = require('os');
const path = require('path');

const ROOT = path.resolve(__dirname, '..');

/// A function that prints "<tool>: error: <msg>" on stderr and exits with status 1.
function dieFor(tool) {
  return (msg) => {
    process.stderr.write(`${tool}: error: ${msg}\n`);
    process.exit(1);
  };
}

/// Median of the numbers in `v` (the mean of the two middle ones for an even count; NaN for none).
function median(v) {
  const s = [...v].sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

const round = (x, d = 3) => (x === null || x === undefined ? null : Number(x.toFixed(d)));

/// Output of `cmd args` run in the repository root, trimmed; null when it fails.
function sh(cmd, args) {
  try { return execFileSync(cmd, args, { encoding: 'utf8', cwd: ROOT }).trim(); } catch (e) { return null; }
}

/// CPU model (lscpu's "Model name"), core count, memory in GiB, kernel release and host name.
function machine() {
  const cpu = (sh('lscpu', []) || '').split('\n').find((l) => l.startsWith('Model name:'));
  return { cpu: cpu ? cpu.replace(/^Model name:\s*/, '') : os.cpus()[0].model, cores: os.cpus().length,
    mem_gb: round(os.totalmem() / 2 ** 30, 1), kernel: os.release(), hostname: os.hostname() };
}

/// The checked-out commit (short hash, null outside git) and whether tracked files differ from it.
function gitState() {
  return { commit: sh('git', ['rev-parse', '--short', 'HEAD']),
    dirty: (sh('git', ['status', '--porcelain', '--untracked-files=no']) || '') !== '' };
}

module.exports = { ROOT, dieFor, median, round, sh, machine, gitState };
