'use strict';
// Minimal reader for ONNX ModelProto files (protobuf wire format), enough to list a model's graph:
// opsets, inputs/outputs with types, initializers, nodes with attributes, subgraphs.
// Field numbers follow onnx.proto (Debian: /usr/include/onnx/onnx.proto). No dependencies.
// Raw tensor bytes are not copied: a TensorProto keeps {dims, dataType, name, rawData (Buffer view)}.

// Reads a varint at buf[pos]; returns [BigInt value, new pos].
function varint(buf, pos) {
  let result = 0n, shift = 0n;
  for (;;) {
    if (pos >= buf.length) throw new Error('truncated varint');
    const b = buf[pos++];
    result |= BigInt(b & 0x7f) << shift;
    if ((b & 0x80) === 0) return [result, pos];
    shift += 7n;
    if (shift > 70n) throw new Error('varint too long');
  }
}

// int64 as a JS number when exact, otherwise as a BigInt (e.g. INT64_MAX in Slice ends).
function int64(v) {
  const s = BigInt.asIntN(64, v);
  return (s >= BigInt(Number.MIN_SAFE_INTEGER) && s <= BigInt(Number.MAX_SAFE_INTEGER)) ? Number(s) : s;
}

// Splits one message into fields: [{num, wire, v}] where v is a BigInt (varint), a Buffer (length
// delimited), or a Buffer of 4/8 bytes (fixed32/fixed64).
function fields(buf) {
  const out = [];
  let pos = 0;
  while (pos < buf.length) {
    let key;
    [key, pos] = varint(buf, pos);
    const num = Number(key >> 3n), wire = Number(key & 7n);
    if (wire === 0) {
      let v; [v, pos] = varint(buf, pos); out.push({ num, wire, v });
    } else if (wire === 2) {
      let len; [len, pos] = varint(buf, pos);
      const end = pos + Number(len);
      if (end > buf.length) throw new Error('truncated length-delimited field');
      out.push({ num, wire, v: buf.subarray(pos, end) }); pos = end;
    } else if (wire === 5) {
      out.push({ num, wire, v: buf.subarray(pos, pos + 4) }); pos += 4;
    } else if (wire === 1) {
      out.push({ num, wire, v: buf.subarray(pos, pos + 8) }); pos += 8;
    } else {
      throw new Error(`unsupported wire type ${wire}`);
    }
  }
  return out;
}

const str = (f) => f.v.toString('utf8');

// Repeated int64: packed (wire 2) or not (wire 0).
function pushInts(arr, f) {
  if (f.wire === 0) { arr.push(int64(f.v)); return; }
  let pos = 0;
  while (pos < f.v.length) { let v; [v, pos] = varint(f.v, pos); arr.push(int64(v)); }
}
function pushFloats(arr, f) {
  if (f.wire === 5) { arr.push(f.v.readFloatLE(0)); return; }
  for (let i = 0; i + 4 <= f.v.length; i += 4) arr.push(f.v.readFloatLE(i));
}

const DTYPES = { 0: 'undefined', 1: 'f32', 2: 'u8', 3: 'i8', 4: 'u16', 5: 'i16', 6: 'i32', 7: 'i64',
  8: 'string', 9: 'bool', 10: 'f16', 11: 'f64', 12: 'u32', 13: 'u64', 16: 'bf16' };

function tensor(buf) {
  const t = { dims: [], dataType: 0, name: '', rawData: null, floatData: [], int64Data: [], int32Data: [],
    doubleData: [], external: false };
  for (const f of fields(buf)) {
    switch (f.num) {
      case 1: pushInts(t.dims, f); break;
      case 2: t.dataType = Number(f.v); break;
      case 4: pushFloats(t.floatData, f); break;
      case 5: pushInts(t.int32Data, f); break;
      case 7: pushInts(t.int64Data, f); break;
      case 8: t.name = str(f); break;
      case 9: t.rawData = f.v; break;
      case 10: for (let i = 0; i + 8 <= f.v.length; i += 8) t.doubleData.push(f.v.readDoubleLE(i)); break;
      case 14: t.external = Number(f.v) === 1; break;
      default: break;
    }
  }
  t.dtype = DTYPES[t.dataType] || `type${t.dataType}`;
  return t;
}

// Tensor values as a JS array (numbers/BigInts), for small tensors (shape constants etc.).
function tensorValues(t) {
  const n = t.dims.reduce((a, b) => a * Number(b), 1);
  if (t.rawData) {
    const b = t.rawData, out = [];
    const rd = { f32: (i) => b.readFloatLE(4 * i), f64: (i) => b.readDoubleLE(8 * i),
      i64: (i) => int64(b.readBigInt64LE(8 * i)), i32: (i) => b.readInt32LE(4 * i),
      i8: (i) => b.readInt8(i), u8: (i) => b.readUInt8(i), bool: (i) => b.readUInt8(i) !== 0 }[t.dtype];
    if (!rd) return null;
    for (let i = 0; i < n; i++) out.push(rd(i));
    return out;
  }
  if (t.dtype === 'f32') return t.floatData;
  if (t.dtype === 'i64') return t.int64Data;
  if (t.dtype === 'f64') return t.doubleData;
  if (['i32', 'i16', 'i8', 'u8', 'u16', 'bool'].includes(t.dtype)) return t.int32Data;
  return null;
}

function shapeProto(buf) {
  const dims = [];
  for (const f of fields(buf)) {
    if (f.num !== 1) continue;
    let d = '?';
    for (const g of fields(f.v)) {
      if (g.num === 1) d = int64(g.v);
      else if (g.num === 2) d = str(g);
    }
    dims.push(d);
  }
  return dims;
}

// TypeProto.Tensor (dtype and shape) into vi.
function tensorType(vi, buf) {
  for (const h of fields(buf)) {
    if (h.num === 1) vi.dtype = DTYPES[Number(h.v)] || `type${h.v}`;
    else if (h.num === 2) vi.shape = shapeProto(h.v);
  }
}

// A ValueInfoProto: {name, dtype, shape, optional}. dtype 'non-tensor' for sequences, maps and optionals
// of anything but a tensor; an optional tensor (TypeProto field 9 holding field 1) sets optional.
function valueInfo(buf) {
  const vi = { name: '', dtype: '?', shape: null, optional: false };
  for (const f of fields(buf)) {
    if (f.num === 1) vi.name = str(f);
    else if (f.num === 2) {
      for (const g of fields(f.v)) {
        if (g.num === 1) { tensorType(vi, g.v); continue; }
        if (g.num === 9) {
          let held = false;
          for (const e of fields(g.v))
            if (e.num === 1)
              for (const t of fields(e.v))
                if (t.num === 1) { tensorType(vi, t.v); held = true; }
          if (held) { vi.optional = true; continue; }
        }
        vi.dtype = 'non-tensor';
      }
    }
  }
  return vi;
}

// An OptionalProto (onnx-data.proto): {name, elemType (0 empty, 1 tensor), tensorValue (raw bytes)}.
function optional(buf) {
  const o = { name: '', elemType: 0, tensorValue: null };
  for (const f of fields(buf)) {
    if (f.num === 1) o.name = str(f);
    else if (f.num === 2) o.elemType = Number(f.v);
    else if (f.num === 3) o.tensorValue = f.v;
  }
  return o;
}

const ATTR_TYPES = { 1: 'f', 2: 'i', 3: 's', 4: 't', 5: 'g', 6: 'floats', 7: 'ints', 8: 'strings', 9: 'tensors',
  10: 'graphs' };

function attribute(buf) {
  const a = { name: '', type: null, floats: [], ints: [], strings: [], tensors: [], graphs: [] };
  for (const f of fields(buf)) {
    switch (f.num) {
      case 1: a.name = str(f); break;
      case 20: a.type = ATTR_TYPES[Number(f.v)] || `type${f.v}`; break;
      case 2: a.f = f.v.readFloatLE(0); break;
      case 3: a.i = int64(f.v); break;
      case 4: a.s = str(f); break;
      case 5: a.t = tensor(f.v); break;
      case 6: a.g = graph(f.v); break;
      case 7: pushFloats(a.floats, f); break;
      case 8: pushInts(a.ints, f); break;
      case 9: a.strings.push(str(f)); break;
      case 10: a.tensors.push(tensor(f.v)); break;
      case 11: a.graphs.push(graph(f.v)); break;
      default: break;
    }
  }
  if (!a.type) {  // very old writers omit the discriminator
    a.type = a.g ? 'g' : a.t ? 't' : a.s !== undefined ? 's' : a.ints.length ? 'ints' :
      a.floats.length ? 'floats' : a.f !== undefined ? 'f' : 'i';
  }
  a.value = { f: a.f, i: a.i, s: a.s, t: a.t, g: a.g, floats: a.floats, ints: a.ints, strings: a.strings,
    tensors: a.tensors, graphs: a.graphs }[a.type];
  return a;
}

function node(buf) {
  const n = { input: [], output: [], name: '', opType: '', domain: '', attribute: [] };
  for (const f of fields(buf)) {
    switch (f.num) {
      case 1: n.input.push(str(f)); break;
      case 2: n.output.push(str(f)); break;
      case 3: n.name = str(f); break;
      case 4: n.opType = str(f); break;
      case 5: n.attribute.push(attribute(f.v)); break;
      case 7: n.domain = str(f); break;
      default: break;
    }
  }
  return n;
}

function graph(buf) {
  const g = { name: '', node: [], initializer: [], input: [], output: [], valueInfo: [] };
  for (const f of fields(buf)) {
    switch (f.num) {
      case 1: g.node.push(node(f.v)); break;
      case 2: g.name = str(f); break;
      case 5: g.initializer.push(tensor(f.v)); break;
      case 11: g.input.push(valueInfo(f.v)); break;
      case 12: g.output.push(valueInfo(f.v)); break;
      case 13: g.valueInfo.push(valueInfo(f.v)); break;
      default: break;
    }
  }
  return g;
}

function model(buf) {
  const m = { irVersion: 0, producerName: '', producerVersion: '', opsetImport: [], graph: null,
    functions: 0, metadata: {} };
  for (const f of fields(buf)) {
    switch (f.num) {
      case 1: m.irVersion = int64(f.v); break;
      case 2: m.producerName = str(f); break;
      case 3: m.producerVersion = str(f); break;
      case 7: m.graph = graph(f.v); break;
      case 8: {
        const o = { domain: '', version: 0 };
        for (const g of fields(f.v)) {
          if (g.num === 1) o.domain = str(g);
          else if (g.num === 2) o.version = int64(g.v);
        }
        m.opsetImport.push(o);
        break;
      }
      case 14: {
        let k = '', v = '';
        for (const g of fields(f.v)) { if (g.num === 1) k = str(g); else if (g.num === 2) v = str(g); }
        m.metadata[k] = v;
        break;
      }
      case 25: m.functions++; break;
      default: break;
    }
  }
  if (!m.graph) throw new Error('not an ONNX model: no graph');
  return m;
}

module.exports = { model, graph, tensor, tensorValues, optional, DTYPES };
