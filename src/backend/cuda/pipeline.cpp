#include "backend/cuda/pipeline.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <unordered_set>

#include "backend/cuda/codegen.h"
#include "ir/sym_util.h"
#include "loop/lower.h"
#include "observe/log.h"
#include "protean/error.h"
#include "protean/version.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

using namespace loop;  // the IR this file compiles

namespace {

/// The dispatcher's symbols first, then every other symbol of a value's size, an item_symint's
/// unbacked symbol or a runtime assertion (the cpu pipeline's order: kernels receive them so).
std::vector<sym::Expr> all_symbols(const BackendInput& in) {
  const ir::Graph& g = *in.graph;
  std::vector<sym::Expr> r = in.symbols;
  std::unordered_set<sym::Expr> seen(r.begin(), r.end());
  auto add = [&](sym::Expr e) {
    for (sym::Expr f : sym::free_symbols(e))
      if (seen.insert(f).second) r.push_back(f);
  };
  for (const ir::Value& v : g.values())
    for (const SymInt& s : v.sizes) add(ir::to_expr(s));
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && n.op == ops::OpKind::local_scalar_dense)
      if (const auto* a = n.attrs.find("symbol"); a && std::holds_alternative<SymInt>(*a)) add(ir::to_expr(std::get<SymInt>(*a)));
  for (const sym::RuntimeAssert& a : in.runtime_asserts) add(a.expr);
  return r;
}

template <class Text>
void log_step(const std::string& id, const std::string& what, Text&& text) {
  if (observe::log_enabled(observe::LogCat::OutputCode)) observe::log_line(observe::LogCat::OutputCode, id, what + ":\n" + text());
}

sym::Expr product(const std::vector<sym::Expr>& d, size_t from = 0, size_t to = SIZE_MAX) {
  sym::Expr n = sym::integer(1);
  for (size_t i = from; i < d.size() && i < to; ++i) n = sym::mul(n, d[i]);
  return simplify_index(n);
}

BufferPlan plan_buffers(const Program& p) {
  BufferPlan plan;
  plan.outputs = p.outputs;
  plan.slots.resize(static_cast<size_t>(p.num_slots));
  for (const Buffer& b : p.buffers) {
    PlannedBuffer pb;
    pb.id = b.id;
    pb.dtype = b.dtype;
    pb.sizes = b.sizes;
    pb.bytes = simplify_index(sym::mul(product(b.sizes), sym::integer(static_cast<int64_t>(itemsize(b.dtype)))));
    pb.kind = b.kind;
    pb.input_index = b.input_index;
    pb.slot = b.slot;
    pb.constant = b.constant;
    pb.from_extern = b.from_extern;
    for (size_t i = 0; i < p.outputs.size(); ++i)
      if (p.outputs[i] == b.id) {
        pb.output_index = static_cast<int>(i);
        break;
      }
    if (b.slot >= 0 && b.slot < p.num_slots) {
      Slot& s = plan.slots[static_cast<size_t>(b.slot)];
      s.bytes = s.bytes ? simplify_index(sym::maximum(s.bytes, pb.bytes)) : pb.bytes;
      s.members.push_back(b.id);
    }
    plan.buffers.push_back(std::move(pb));
  }
  for (Slot& s : plan.slots)
    if (!s.bytes) s.bytes = sym::integer(0);
  return plan;
}

bool blas_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

std::optional<BlasStep> blas_step(const Program& p, const Extern& e, std::string& why) {
  using ops::OpKind;
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  BlasStep s;
  s.kind = e.op;
  if (e.op == OpKind::matmul) s.op = BlasOp::Matmul;
  else if (e.op == OpKind::bmm) s.op = BlasOp::Bmm;
  else if (e.op == OpKind::linear) s.op = BlasOp::Linear;
  else {
    why = "no GPU lowering";
    return std::nullopt;
  }
  if (e.inputs.size() < 2 || e.outputs.size() != 1 || e.inputs[0] < 0 || e.inputs[1] < 0) {
    why = "unexpected operands";
    return std::nullopt;
  }
  const Buffer& a = buf(e.inputs[0]);
  const Buffer& b = buf(e.inputs[1]);
  const Buffer& o = buf(e.outputs[0]);
  if (!blas_dtype(a.dtype) || a.dtype != b.dtype || a.dtype != o.dtype) {
    why = fmt::format("dtype {} (cuBLASLt steps take f32, bf16 and f16)", short_name(a.dtype));
    return std::nullopt;
  }
  s.a = e.inputs[0];
  s.b = e.inputs[1];
  s.out = e.outputs[0];
  s.dtype = a.dtype;
  s.batch = sym::integer(1);
  s.batch_stride_a = sym::integer(0);
  s.batch_stride_b = sym::integer(0);
  const size_t ra = a.sizes.size(), rb = b.sizes.size();
  if (s.op == BlasOp::Linear) {
    if (ra < 1 || rb != 2) {
      why = "linear with a weight that is not 2-D";
      return std::nullopt;
    }
    s.transpose_b = true;
    s.m = product(a.sizes, 0, ra - 1);
    s.k = a.sizes[ra - 1];
    s.n = b.sizes[0];
    if (e.inputs.size() > 2 && e.inputs[2] >= 0) s.epilogue.bias = e.inputs[2];
    return s;
  }
  if (ra < 2 || rb < 2) {
    why = "a matrix-vector product";
    return std::nullopt;
  }
  s.m = a.sizes[ra - 2];
  s.k = a.sizes[ra - 1];
  s.n = b.sizes[rb - 1];
  if (rb == 2) {  // [..., m, k] x [k, n]: the batch flattens into rows
    s.m = product(a.sizes, 0, ra - 1);
    return s;
  }
  if (ra == 3 && rb == 3) {
    const sym::Expr ba = a.sizes[0], bb = b.sizes[0];
    s.batch = ba;
    s.batch_stride_a = simplify_index(sym::mul(s.m, s.k));
    s.batch_stride_b = simplify_index(sym::mul(s.k, s.n));
    if (ba != bb) {
      if (bb->is_integer(1)) s.batch_stride_b = sym::integer(0);
      else if (ba->is_integer(1)) {
        s.batch = bb;
        s.batch_stride_a = sym::integer(0);
      } else {
        why = "batch sizes that differ";
        return std::nullopt;
      }
    }
    return s;
  }
  why = fmt::format("a {}-D x {}-D product (only 2-D, flattened and 3-D batches go to cuBLASLt)", ra, rb);
  return std::nullopt;
}

CudaProgram compile_cuda_program(const BackendInput& in, const CudaCompileOptions& o, CudaCompileInfo* info) {
  CudaCompileInfo local;
  CudaCompileInfo& ci = info ? *info : local;
  const std::string graph = in.graph ? in.graph->name : "?";
  if (!in.graph) throw CompileError("cuda backend: no graph to compile");
  for (size_t i = 0; i < in.symbols.size(); ++i) {
    if (!in.symbols[i] || !in.symbols[i]->is_symbol())
      throw CompileError(fmt::format("cuda backend: size argument {} of graph '{}' is {}, not a size symbol", i, graph,
                                     in.symbols[i] ? "'" + sym::print(in.symbols[i]) + "'" : "missing"));
    for (size_t j = 0; j < i; ++j)
      if (in.symbols[j] == in.symbols[i])
        throw CompileError(fmt::format("cuda backend: size arguments {} and {} of graph '{}' are the same symbol {}", j, i, graph,
                                       sym::print(in.symbols[i])));
  }

  loop::LowerOptions lo;
  lo.half_storage = true;  // bf16/f16 buffers, f32 compute (codegen.h)
  Program p = ci.phases.time("cuda lowering", [&] { return loop::lower_graph(*in.graph, all_symbols(in), lo); });
  ci.schedule = ci.phases.time("cuda scheduling", [&] { return loop::schedule_program(p); });
  ci.loop_ir = to_text(p);
  log_step(in.compile_id, "cuda loop IR after scheduling", [&] { return ci.loop_ir; });
  const std::vector<CudaSchedule> schedules = ci.phases.time("cuda schedule policy", [&] { return cuda_schedule(p, o.schedule); });
  log_step(in.compile_id, "cuda schedules", [&] {
    std::string t;
    for (size_t i = 0; i < schedules.size(); ++i) t += p.kernels[i].name + ": " + cuda_schedule_text(schedules[i]) + "\n";
    return t;
  });

  CudaProgram cp;
  cp.name = graph;
  cp.symbols = p.symbols;
  RenderedProgram r = ci.phases.time("cuda codegen", [&] { return render_cuda(p, schedules); });
  for (CudaKernel& k : r.kernels) {
    k.general.launch.max_blocks = o.schedule.max_grid_blocks;
    k.aligned.launch.max_blocks = o.schedule.max_grid_blocks;
  }
  cp.source = std::move(r.source);
  cp.kernels = std::move(r.kernels);
  log_step(in.compile_id, "cuda output code", [&] { return cp.source; });
  cp.buffers = plan_buffers(p);

  // steps in program order
  for (const loop::Step& st : p.steps) {
    Step s;
    s.release = st.release;
    if (st.is_kernel) {
      s.kind = StepKind::Kernel;
      s.index = st.index;
    } else {
      const Extern& e = p.externs[static_cast<size_t>(st.index)];
      std::string why;
      if (std::optional<BlasStep> b = blas_step(p, e, why)) {
        s.kind = StepKind::Blas;
        s.index = static_cast<int>(cp.blas.size());
        cp.blas.push_back(std::move(*b));
      } else {
        s.kind = StepKind::Host;
        s.index = static_cast<int>(cp.host.size());
        if (observe::log_enabled(observe::LogCat::PerfHints))
          observe::log_line(observe::LogCat::PerfHints, in.compile_id,
                            fmt::format("cuda backend: {} runs on the host ({}): its inputs and outputs are copied between "
                                        "device and host",
                                        ops::op_name(e.op), why));
        cp.host.push_back({e, why});
      }
    }
    cp.steps.push_back(std::move(s));
  }
  ci.kernels = static_cast<int>(cp.kernels.size());
  ci.blas = static_cast<int>(cp.blas.size());
  ci.host = static_cast<int>(cp.host.size());

  if (o.compile && !cp.kernels.empty()) {
    const std::string tu = fmt::format("{}.cu", graph.empty() ? "graph" : graph);
    NvrtcResult res = ci.phases.time("cuda nvrtc", [&] { return nvrtc_compile(cp.source, tu, o.nvrtc); });
    cp.cubin = std::move(res.cubin);
    cp.compile_log = res.log;
    ci.nvrtc_log = res.log;
    ci.nvrtc_ms = res.seconds * 1e3;
    for (CudaKernel& k : cp.kernels) {
      if (auto it = res.resources.find(k.general.entry); it != res.resources.end()) k.general.resources = it->second;
      if (auto it = res.resources.find(k.aligned.entry); it != res.resources.end()) k.aligned.resources = it->second;
    }
    cp.key.source_hash = XXH64(cp.source.data(), cp.source.size(), 0);
    cp.key.nvrtc_version = nvrtc_version();
    cp.key.arch = o.nvrtc.arch;
    for (const std::string& f : nvrtc_flags(o.nvrtc)) cp.key.flags += (cp.key.flags.empty() ? "" : " ") + f;
    cp.key.protean_version = version();
  }
  return cp;
}

}  // namespace protean::backend::cuda
