// Pieces of hand-built CUDA programs for the fake-driver tests (fake_driver_test.cpp, graphs_test.cpp):
// f32 buffers of n elements, the input → temp → output plan, and a grid-stride kernel with an aligned
// and a general variant. The fake driver runs the kernels the test defines under their entry names.
#pragma once

#include <string>

#include "backend/cuda/program.h"
#include "sym/expr.h"

namespace protean::backend::cuda::testing {

/// An f32 buffer of `n` elements (4·n bytes), dense.
inline PlannedBuffer f32_buffer(int id, loop::BufferKind kind, const sym::Expr& n) {
  PlannedBuffer b;
  b.id = id;
  b.dtype = DType::F32;
  b.sizes = {n};
  b.bytes = sym::mul(n, sym::integer(4));
  b.kind = kind;
  return b;
}

/// Buffers 0 (graph input 0), 1 (a temp in slot 0: 4·n bytes, 256-byte aligned) and 2 (graph output 0).
inline void plan_input_temp_output(CudaProgram& p, const sym::Expr& n) {
  PlannedBuffer in = f32_buffer(0, loop::BufferKind::Input, n);
  in.input_index = 0;
  PlannedBuffer tmp = f32_buffer(1, loop::BufferKind::Temp, n);
  tmp.slot = 0;
  PlannedBuffer out = f32_buffer(2, loop::BufferKind::Output, n);
  out.output_index = 0;
  p.buffers.buffers = {in, tmp, out};
  p.buffers.slots = {Slot{sym::mul(n, sym::integer(4)), 256, {1}}};
  p.buffers.outputs = {2};
}

/// Kernel `name` reading buffer `src` and writing `dst` over n elements: entries `<name>_aligned`
/// (4 items per thread, when n is a multiple of 4 and both buffers are aligned) and `<name>_general`;
/// parameters (src pointer, dst pointer, n) in a 24-byte block.
inline CudaKernel grid_stride_kernel(const std::string& name, int src, int dst, const sym::Expr& n) {
  CudaKernel k;
  k.name = name;
  k.aligned.entry = name + "_aligned";
  k.general.entry = name + "_general";
  for (auto* v : {&k.aligned, &k.general}) {
    v->launch.shape = LaunchShape::GridStride;
    v->launch.work = n;
    v->launch.block_threads = 128;
  }
  k.aligned.launch.items_per_thread = 4;
  k.rule.divisible = {n};
  k.rule.multiple = 4;
  k.rule.aligned_buffers = {src, dst};
  k.params = {{ParamKind::Buffer, src, 0, 8}, {ParamKind::Buffer, dst, 8, 8}, {ParamKind::Symbol, 0, 16, 8}};
  k.arg_block_bytes = 24;
  return k;
}

}  // namespace protean::backend::cuda::testing
