#!/usr/bin/env node
'use strict';
// Self-test of npy.js: every dtype round-trips, headers are 64-byte aligned, version 2.0 headers are
// written when needed and read back, and malformed files give clear errors. Exits non-zero on failure.
const assert = require('assert');
const npy = require('./npy');

function roundTrip(arr) {
  const buf = npy.encode(arr);
  const headerEnd = buf[6] === 1 ? 10 + buf.readUInt16LE(8) : 12 + buf.readUInt32LE(8);
  assert.strictEqual(headerEnd % 64, 0, 'header is padded to 64 bytes');
  const back = npy.decode(buf, 'selftest');
  assert.strictEqual(back.dtype, arr.dtype);
  assert.deepStrictEqual(back.shape, arr.shape);
  assert.deepStrictEqual(Array.from(back.data), Array.from(arr.data));
  return buf;
}

roundTrip({ dtype: 'f32', shape: [2, 3], data: Float32Array.from([1, -2.5, 3e-8, Infinity, 0, 7]) });
roundTrip({ dtype: 'f32', shape: [], data: Float32Array.from([42]) });
roundTrip({ dtype: 'f32', shape: [0, 4], data: new Float32Array(0) });
roundTrip({ dtype: 'i64', shape: [3], data: BigInt64Array.from([0n, -1n, 9223372036854775807n]) });
roundTrip({ dtype: 'bool', shape: [2, 2], data: Uint8Array.from([1, 0, 0, 1]) });
roundTrip({ dtype: 'f16', shape: [4], data: Uint16Array.from([0x3c00, 0xc000, 0x7bff, 0x0001]) });
roundTrip({ dtype: 'i32', shape: [1, 1, 2], data: Int32Array.from([5, -6]) });
roundTrip({ dtype: 'u8', shape: [3], data: Uint8Array.from([0, 128, 255]) });

// The exact header NumPy writes for a (1, 3) float32 array.
const b = npy.encode({ dtype: 'f32', shape: [1, 3], data: new Float32Array(3) });
assert.strictEqual(b.toString("latin1", 10, 128).trimEnd(), "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }");
assert.strictEqual(b.length, 128 + 12);  // 10 + 59 + padding + newline = 128, as NumPy writes
// One-dimensional shapes keep the trailing comma: (5,)
assert.ok(npy.encode({ dtype: 'u8', shape: [5], data: new Uint8Array(5) }).toString('latin1').includes("'shape': (5,)"));

// A header longer than 65535 bytes forces version 2.0.
const manyDims = new Array(30000).fill(1);
const v2 = roundTrip({ dtype: 'u8', shape: manyDims, data: new Uint8Array(1) });
assert.strictEqual(v2[6], 2);

// f16 conversions.
assert.strictEqual(npy.floatToHalf(1), 0x3c00);
assert.strictEqual(npy.floatToHalf(-2), 0xc000);
assert.strictEqual(npy.floatToHalf(65504), 0x7bff);
assert.strictEqual(npy.halfToFloat(0x3555), 0.333251953125);
assert.strictEqual(npy.halfToFloat(npy.floatToHalf(0.1)), 0.0999755859375);

// Errors name the problem.
assert.throws(() => npy.decode(Buffer.from('garbage!garbage!'), 'x.npy'), /x\.npy: not a \.npy file/);
const truncated = npy.encode({ dtype: 'f32', shape: [4], data: new Float32Array(4) }).subarray(0, 128 + 8);  // header + 2 of 4 floats
assert.throws(() => npy.decode(truncated, 't.npy'), /t\.npy: truncated \.npy data/);
const fortran = Buffer.from(npy.encode({ dtype: 'f32', shape: [1], data: new Float32Array(1) }).toString('latin1')
  .replace('False', 'True '), 'latin1');
assert.throws(() => npy.decode(fortran, 'f.npy'), /Fortran-order/);
const complex = Buffer.from(npy.encode({ dtype: 'f64', shape: [1], data: new Float64Array(1) }).toString('latin1')
  .replace('<f8', '<c8'), 'latin1');
assert.throws(() => npy.decode(complex, 'c.npy'), /unsupported \.npy dtype '<c8'/);
assert.throws(() => npy.read('/nonexistent/a.npy'), /\/nonexistent\/a\.npy: cannot read/);

console.log('npy_selftest: ok');
