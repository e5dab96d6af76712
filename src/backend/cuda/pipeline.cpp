#include "backend/cuda/pipeline.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <functional>
#include <unordered_set>

#include "backend/cuda/codegen.h"
#include "backend/kernel_symbols.h"
#include "ir/sym_util.h"
#include "loop/lower.h"
#include "observe/log.h"
#include "protean/error.h"
#include "protean/version.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

using namespace loop;  // the IR this file compiles

namespace {


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

/// Whether any step other than `skip_kernel` (a kernel index) and the extern `skip_extern` reads `b`.
bool read_elsewhere(const Program& p, int b, int skip_kernel, int skip_extern) {
  std::function<bool(const SExpr&)> reads = [&](const SExpr& e) {
    if (e->op == SOp::Load && e->buffer == b) return true;
    for (const SExpr& a : e->args)
      if (reads(a)) return true;
    return false;
  };
  for (size_t k = 0; k < p.kernels.size(); ++k)
    if (static_cast<int>(k) != skip_kernel)
      for (const Stage& st : p.kernels[k].stages)
        if (reads(st.body)) return true;
  for (size_t e = 0; e < p.externs.size(); ++e)
    if (static_cast<int>(e) != skip_extern)
      for (int in : p.externs[e].inputs)
        if (in == b) return true;
  for (int o : p.outputs)
    if (o == b) return true;
  return false;
}

/// Matches the body of the pointwise kernel after a matrix product writing `o` against
/// `[gelu](o [+ bias]) [+ residual]` (gelu's erf form x * Phi(x), bias broadcast over rows, residual of
/// the product's shape), reading `o` at `idx` and the bias at `col`. Fills `ep`; false when it is
/// something else.
bool match_epilogue(const Program& p, const SExpr& body, int o, sym::Expr idx, sym::Expr col, BlasEpilogue& ep) {
  const Buffer& ob = p.buffers[static_cast<size_t>(o)];
  auto is_o = [&](const SExpr& e) { return e->op == SOp::Load && e->buffer == o && e->index == idx; };
  auto is_add = [](const SExpr& e) { return e->op == SOp::Binary && e->fn == ScalarOp::add; };
  auto operand_load = [&](const SExpr& e, bool bias) -> int {
    if (e->op != SOp::Load || e->buffer == o) return -1;
    const Buffer& b = p.buffers[static_cast<size_t>(e->buffer)];
    if (b.dtype != ob.dtype) return -1;
    if (bias) return b.sizes.size() == 1 && b.sizes[0] == ob.sizes.back() && e->index == col ? e->buffer : -1;
    return b.sizes == ob.sizes && e->index == idx ? e->buffer : -1;
  };
  // y = o [+ bias]
  auto match_y = [&](const SExpr& e, int& bias) {
    if (is_o(e)) return true;
    if (!is_add(e)) return false;
    for (int k = 0; k < 2; ++k)
      if (is_o(e->args[k]) && (bias = operand_load(e->args[1 - k], true)) >= 0) return true;
    return false;
  };
  // r = gelu(y) | y
  auto match_r = [&](const SExpr& e, int& bias, GeluForm& g) {
    if (e->op == SOp::Binary && e->fn == ScalarOp::mul)
      for (int k = 0; k < 2; ++k) {
        const SExpr& phi = e->args[1 - k];
        if (phi->op == SOp::Unary && phi->fn == ScalarOp::normal_cdf && s_text(phi->args[0]) == s_text(e->args[k]) &&
            match_y(e->args[k], bias)) {
          g = GeluForm::Erf;
          return true;
        }
      }
    return match_y(e, bias);
  };
  int bias = -1, residual = -1;
  GeluForm g = GeluForm::None;
  bool ok = match_r(body, bias, g);
  if (!ok && is_add(body))
    for (int k = 0; k < 2 && !ok; ++k) {
      bias = -1;
      g = GeluForm::None;
      if ((residual = operand_load(body->args[1 - k], false)) >= 0) ok = match_r(body->args[k], bias, g);
    }
  if (!ok || (bias < 0 && g == GeluForm::None && residual < 0)) return false;
  // cuBLASLt's GELU epilogue is the tanh form, and it does not combine GELU with a residual (beta = 1)
  // add: an erf-form GELU stays in its kernel (and the kernel with it)
  if (g == GeluForm::Erf) return false;
  ep.bias = bias;
  ep.gelu = g;
  ep.residual = residual;
  ep.beta = residual >= 0 ? 1.0 : 0.0;
  return true;
}

}  // namespace

std::map<int, BlasEpilogue> fold_blas_epilogues(Program& p) {
  std::map<int, BlasEpilogue> folded;
  for (size_t i = 0; i + 1 < p.steps.size(); ++i) {
    const loop::Step& st = p.steps[i];
    const loop::Step& next = p.steps[i + 1];
    if (st.is_kernel || !next.is_kernel) continue;
    Extern& e = p.externs[static_cast<size_t>(st.index)];
    std::string why;
    std::optional<BlasStep> b = blas_step(p, e, why);
    if (!b) continue;
    const int o = b->out;
    const Buffer& ob = p.buffers[static_cast<size_t>(o)];
    if (ob.kind != BufferKind::Temp || ob.sizes.empty()) continue;
    const Kernel& k = p.kernels[static_cast<size_t>(next.index)];
    if (k.stages.size() != 1 || k.stages[0].kind != StageKind::Pointwise || !k.stages[0].inner.empty() || k.outer != ob.sizes)
      continue;
    const Stage& s = k.stages[0];
    std::vector<sym::Expr> vars;
    for (size_t d = 0; d < k.outer.size(); ++d) vars.push_back(outer_var(d));
    const sym::Expr idx = linear_index(vars, ob.sizes);
    const Buffer& out = p.buffers[static_cast<size_t>(s.out)];
    if (s.out_index != idx || out.dtype != ob.dtype || out.sizes != ob.sizes || out.kind == BufferKind::Input) continue;
    if (read_elsewhere(p, o, next.index, st.index)) continue;
    BlasEpilogue ep;
    if (!match_epilogue(p, s.body, o, idx, outer_var(k.outer.size() - 1), ep)) continue;
    if (ep.bias >= 0 && b->epilogue.bias >= 0) continue;  // a linear's own bias and a second one
    // the product writes the kernel's output directly; the kernel goes
    e.outputs[0] = s.out;
    p.buffers[static_cast<size_t>(s.out)].from_extern = true;
    folded[st.index] = ep;
    const int gone = next.index;
    std::vector<int> release = next.release;
    p.kernels.erase(p.kernels.begin() + gone);
    p.steps.erase(p.steps.begin() + static_cast<long>(i) + 1);
    for (loop::Step& x : p.steps)
      if (x.is_kernel && x.index > gone) --x.index;
    p.steps[i].release.insert(p.steps[i].release.end(), release.begin(), release.end());
  }
  return folded;
}

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
  Program p = ci.phases.time("cuda lowering", [&] { return loop::lower_graph(*in.graph, kernel_symbols(in), lo); });
  ci.schedule = ci.phases.time("cuda scheduling", [&] { return loop::schedule_program(p); });
  const std::map<int, BlasEpilogue> epilogues = ci.phases.time("cuda epilogue folding", [&] { return fold_blas_epilogues(p); });
  ci.folded_epilogues = static_cast<int>(epilogues.size());
  // the capture's symbol bounds (marks, guards), then the options' own (tests), the tighter one winning
  loop::CudaScheduleOptions so = o.schedule;
  for (const auto& [name, hi] : in.upper_bounds) {
    auto [it, fresh] = so.upper_bounds.emplace(name, hi);
    if (!fresh) it->second = std::min(it->second, hi);
  }
  ci.phases.time("cuda schedule policy", [&] { loop::apply_schedule(p, loop::CudaSchedulePolicy(so)); });
  // the loop IR text (with each kernel's schedule) only when asked for (compile_cuda_program with
  // `info`, or the output_code log)
  if (info || observe::log_enabled(observe::LogCat::OutputCode)) ci.loop_ir = to_text(p);
  log_step(in.compile_id, "cuda loop IR after scheduling", [&] { return ci.loop_ir; });
  log_step(in.compile_id, "cuda schedules", [&] {
    std::string t;
    for (const loop::Kernel& k : p.kernels) t += k.name + ": " + loop::schedule_text(k) + "\n";
    return t;
  });

  CudaProgram cp;
  cp.name = graph;
  cp.symbols = p.symbols;
  RenderedProgram r = ci.phases.time("cuda codegen", [&] { return render_cuda(p); });
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
        if (auto f = epilogues.find(st.index); f != epilogues.end()) {
          const int bias = b->epilogue.bias;  // linear's own bias stays
          b->epilogue = f->second;
          if (bias >= 0) b->epilogue.bias = bias;
        }
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
