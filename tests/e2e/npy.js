'use strict';
// Tiny .npy reader/writer (NumPy format 1.0/2.0/3.0 on read, 1.0 or 2.0 on write): little-endian,
// C order only. An array is {dtype, shape, data} where dtype is one of the names below and data a typed
// array (bool → Uint8Array of 0/1, f16 → Uint16Array of raw IEEE half bits, i64/u64 → BigInt64Array/
// BigUint64Array). Spec: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
const fs = require('fs');

// dtype name → [numpy descr, bytes per element, typed array constructor]
const DTYPES = {
  f32: ['<f4', 4, Float32Array],
  f64: ['<f8', 8, Float64Array],
  f16: ['<f2', 2, Uint16Array],
  i64: ['<i8', 8, BigInt64Array],
  u64: ['<u8', 8, BigUint64Array],
  i32: ['<i4', 4, Int32Array],
  u32: ['<u4', 4, Uint32Array],
  i16: ['<i2', 2, Int16Array],
  u16: ['<u2', 2, Uint16Array],
  i8: ['|i1', 1, Int8Array],
  u8: ['|u1', 1, Uint8Array],
  bool: ['|b1', 1, Uint8Array],
};
const BY_DESCR = {};
for (const [name, [descr]] of Object.entries(DTYPES)) {
  BY_DESCR[descr] = name;
  if (descr[0] === '<') BY_DESCR[`|${descr.slice(1)}`] = name;  // tolerate '|' for any width
}
BY_DESCR['<b1'] = 'bool'; BY_DESCR['<u1'] = 'u8'; BY_DESCR['<i1'] = 'i8';

const MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]);  // \x93NUMPY

function numel(shape) { return shape.reduce((a, b) => a * b, 1); }

// Parses the header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }
function parseHeader(text, what) {
  const descr = /'descr'\s*:\s*'([^']+)'/.exec(text);
  const fortran = /'fortran_order'\s*:\s*(True|False)/.exec(text);
  const shape = /'shape'\s*:\s*\(([^)]*)\)/.exec(text);
  if (!descr || !fortran || !shape) throw new Error(`${what}: malformed .npy header: ${text.trim()}`);
  if (fortran[1] === 'True') throw new Error(`${what}: Fortran-order .npy arrays are not supported`);
  if (descr[1][0] === '>') throw new Error(`${what}: big-endian .npy arrays are not supported (${descr[1]})`);
  const dtype = BY_DESCR[descr[1]];
  if (!dtype) throw new Error(`${what}: unsupported .npy dtype '${descr[1]}' (supported: ${Object.keys(DTYPES).join(', ')})`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length > 0).map((s) => {
    const v = Number(s.replace(/L$/, ''));
    if (!Number.isInteger(v) || v < 0) throw new Error(`${what}: bad dimension '${s}' in .npy shape`);
    return v;
  });
  return { dtype, shape: dims };
}

// Decodes a .npy image held in a Buffer. `what` names the source in errors.
function decode(buf, what = '.npy buffer') {
  if (buf.length < 10 || !buf.subarray(0, 6).equals(MAGIC)) throw new Error(`${what}: not a .npy file (bad magic)`);
  const major = buf[6];
  let headerLen, offset;
  if (major === 1) { headerLen = buf.readUInt16LE(8); offset = 10; }
  else if (major === 2 || major === 3) {
    if (buf.length < 12) throw new Error(`${what}: truncated .npy header`);
    headerLen = buf.readUInt32LE(8); offset = 12;
  } else throw new Error(`${what}: unsupported .npy version ${major}.${buf[7]}`);
  if (offset + headerLen > buf.length) throw new Error(`${what}: truncated .npy header`);
  const { dtype, shape } = parseHeader(buf.toString(major === 3 ? 'utf8' : 'latin1', offset, offset + headerLen), what);
  const start = offset + headerLen;
  const [, size, Ctor] = DTYPES[dtype];
  const n = numel(shape);
  if (buf.length - start < n * size) {
    throw new Error(`${what}: truncated .npy data: need ${n * size} bytes for ${dtype}[${shape}], have ${buf.length - start}`);
  }
  // Copy into a fresh, aligned ArrayBuffer (the file's data offset need not be aligned for the type).
  const bytes = new Uint8Array(n * size);
  bytes.set(buf.subarray(start, start + n * size));
  const data = new Ctor(bytes.buffer, 0, n);
  if (dtype === 'bool') for (let i = 0; i < n; i++) data[i] = data[i] ? 1 : 0;
  return { dtype, shape, data };
}

function read(path) {
  let buf;
  try { buf = fs.readFileSync(path); } catch (e) { throw new Error(`${path}: cannot read .npy file: ${e.message}`); }
  return decode(buf, path);
}

// Encodes {dtype, shape, data} as a .npy Buffer: version 1.0, or 2.0 when the header needs it.
function encode(arr) {
  const spec = DTYPES[arr.dtype];
  if (!spec) throw new Error(`npy: unsupported dtype '${arr.dtype}'`);
  const [descr, size] = spec;
  const n = numel(arr.shape);
  if (arr.data.length !== n) throw new Error(`npy: data has ${arr.data.length} elements, shape [${arr.shape}] needs ${n}`);
  const shapeText = arr.shape.length === 1 ? `(${arr.shape[0]},)` : `(${arr.shape.join(', ')})`;
  let dict = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shapeText}, }`;
  let major = 1, pre = 10;
  if (dict.length + 1 + pre > 65535) { major = 2; pre = 12; }
  const total = Math.ceil((pre + dict.length + 1) / 64) * 64;  // header padded to a multiple of 64
  dict = dict.padEnd(total - pre - 1, ' ') + '\n';
  const head = Buffer.alloc(pre);
  MAGIC.copy(head, 0);
  head[6] = major; head[7] = 0;
  if (major === 1) head.writeUInt16LE(dict.length, 8); else head.writeUInt32LE(dict.length, 8);
  const body = Buffer.from(arr.data.buffer, arr.data.byteOffset, n * size);
  if (!isLittleEndian()) throw new Error('npy: big-endian hosts are not supported');
  return Buffer.concat([head, Buffer.from(dict, 'latin1'), body]);
}

function write(path, arr) { fs.writeFileSync(path, encode(arr)); }

function isLittleEndian() { return new Uint8Array(new Uint16Array([1]).buffer)[0] === 1; }

// IEEE half bits ↔ float, for f16 statistics and random inputs.
function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}
function floatToHalf(x) {
  const f32 = new Float32Array([x]), u = new Uint32Array(f32.buffer)[0];
  const sign = (u >>> 16) & 0x8000, exp = (u >>> 23) & 0xff, mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    const m = (mant | 0x800000) >>> (14 - e);
    return sign | ((m + 1) >>> 1);  // round half up on the dropped bit
  }
  const half = sign | (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  return rest > 0x1000 || (rest === 0x1000 && (half & 1)) ? half + 1 : half;  // round to nearest even
}

module.exports = { read, write, encode, decode, DTYPES, numel, halfToFloat, floatToHalf };
