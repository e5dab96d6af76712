#include "backend/cuda/graphs.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "backend/async_compile.h"
#include "backend/cuda/autotune.h"
#include "backend/cuda/hopper_gemm.h"
#include "backend/cuda/nvrtc.h"
#include "backend/cuda/runner.h"
#include "backend/graph_stats.h"
#include "cache/blob_cache.h"
#include "device/runtime.h"
#include "observe/env.h"
#include "observe/log.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

namespace drv = ::protean::cuda;

namespace {

bool is_output(const CudaProgram& p, int id) {
  return std::find(p.buffers.outputs.begin(), p.buffers.outputs.end(), id) != p.buffers.outputs.end();
}

// Buffers of the arena: temporaries that are not graph outputs.
bool in_arena(const CudaProgram& p, const PlannedBuffer& b) {
  return (b.kind == loop::BufferKind::Temp || b.kind == loop::BufferKind::Output) && !is_output(p, b.id);
}

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

bool uses_symbol(const sym::Expr& e) { return e && !sym::free_symbols(e).empty(); }

/// Adds the one kernel node of a captured library call `child` to `graph` after `dep` (if any) as a
/// kernel node of its own, with the node's launch attributes (cluster dimensions, ...): true; false
/// (nothing added) when the child holds anything else or the driver lacks the entries.
bool add_as_kernel_node(const drv::DriverApi& api, drv::CUgraph child, drv::CUgraph graph, drv::CUgraphNode dep,
                        drv::CUgraphNode& out) {
  if (!api.cuGraphGetNodes || !api.cuGraphNodeGetType || !api.cuGraphKernelNodeGetParams ||
      !api.cuGraphKernelNodeCopyAttributes)
    return false;
  size_t n = 0;
  if (api.cuGraphGetNodes(child, nullptr, &n) != drv::kCudaSuccess || n != 1) return false;
  drv::CUgraphNode src = nullptr;
  int type = -1;
  if (api.cuGraphGetNodes(child, &src, &n) != drv::kCudaSuccess || n != 1 ||
      api.cuGraphNodeGetType(src, &type) != drv::kCudaSuccess || type != drv::kGraphNodeTypeKernel)
    return false;
  drv::KernelNodeParams kp;
  if (api.cuGraphKernelNodeGetParams(src, &kp) != drv::kCudaSuccess) return false;
  drv::CUgraphNode node = nullptr;
  if (api.cuGraphAddKernelNode(&node, graph, dep ? &dep : nullptr, dep ? 1 : 0, &kp) != drv::kCudaSuccess) return false;
  drv::check(api.cuGraphKernelNodeCopyAttributes(node, src), "cuGraphKernelNodeCopyAttributes(a library call's kernel)");
  out = node;
  return true;
}

/// Bucket::lib_algo of a product with a LayerNorm prologue that max-autotune found faster behind the
/// LayerNorm's kernel than with the LayerNorm folded in: the generated product reading the kernel's
/// output (run_blas_at's algorithm -1 on the step with its prologue off).
constexpr int kGeneratedUnfolded = -2;

/// A timed product site's key part for a generated product: whether it is split, and the kernels'
/// source, so a winner timed against another form of the kernel is not reused.
std::string generated_tag(const BlasStep& step, const BlasShape& shape) {
  static const uint64_t source = XXH64(generated_product_source().data(), generated_product_source().size(), 0);
  return fmt::format("|generated{} {:016x}", generated_product_split(step, shape) ? " split" : "", source);
}

/// `s` reading its left operand as planned: its LayerNorm prologue (if any) off.
BlasStep prologue_off(const BlasStep& s) {
  BlasStep r = s;
  r.prologue = LayerNormPrologue{};
  return r;
}

bool is_constant_buffer(const CudaProgram& p, int id) {
  return p.buffers.buffers[static_cast<size_t>(id)].kind == loop::BufferKind::Constant;
}

// A product operand no kernel of the call writes (a constant or a program input: a model's weights,
// or parameters handed in as inputs): the generated product may read it before it waits for the
// kernel ahead (its programmatic edge in a bucket's graph; attention's q·kᵀ reads k, which the kernel
// ahead may still be writing, so a temporary never qualifies), and max-autotune times the product
// with it streaming from device memory, as such weights do in the graph. Recording and tuning both ask
// this, so what is timed is what is recorded.
bool written_before_the_call(const CudaProgram& p, int id) {
  const loop::BufferKind k = p.buffers.buffers[static_cast<size_t>(id)].kind;
  return k == loop::BufferKind::Constant || k == loop::BufferKind::Input;
}

// The operands of a BLAS step (a, b, out, bias, residual, and a folded LayerNorm's x and
// constants), -1 left out.
std::vector<int> blas_operands(const BlasStep& b) {
  std::vector<int> r;
  for (int id : {b.a, b.b, b.out, b.epilogue.bias, b.epilogue.residual, b.prologue.x, b.prologue.weight, b.prologue.vectors})
    if (id >= 0) r.push_back(id);
  return r;
}

/// A recording's stream (its captures and its graphs' uploads), made non-blocking on first use.
void make_capture_stream(const drv::DriverApi& api, drv::CUstream& stream) {
  if (!stream) drv::check(api.cuStreamCreate(&stream, drv::kStreamNonBlocking), "cuStreamCreate(capture stream)");
}

}  // namespace

const char* to_string(LibraryCapture c) {
  switch (c) {
    case LibraryCapture::Padded: return "padded";
    case LibraryCapture::Exact: return "exact";
    case LibraryCapture::Plain: return "plain";
  }
  return "?";
}

std::vector<LibraryNodePlan> library_plan(const CudaProgram& p) {
  std::vector<LibraryNodePlan> r;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (p.steps[i].kind != StepKind::Blas) continue;
    LibraryNodePlan n;
    n.step = i;
    n.blas = p.steps[i].index;
    const BlasStep& b = p.blas[static_cast<size_t>(n.blas)];
    for (int id : blas_operands(b)) {
      const PlannedBuffer& pb = p.buffers.buffers[static_cast<size_t>(id)];
      if (in_arena(p, pb) || is_constant_buffer(p, id)) continue;
      n.how = LibraryCapture::Plain;
      n.why = fmt::format("buffer {} is a graph {} (a new address every call)", id,
                          pb.kind == loop::BufferKind::Input ? "input" : "output");
      break;
    }
    if (n.why.empty()) {
      const bool batch_one = !b.batch || (b.batch->is_integer(1));
      std::string what;
      if (!batch_one) what = uses_symbol(b.batch) ? "batch" : "batch > 1";
      else if (uses_symbol(b.n)) what = "n";
      else if (uses_symbol(b.k)) what = "k";
      if (what.empty()) {
        n.how = LibraryCapture::Padded;
      } else {
        n.how = LibraryCapture::Exact;
        n.why = what == "batch > 1" ? "batched: padding m would move every batch entry"
                                    : fmt::format("{} follows the symbols: padding it would change the layout kernels read", what);
      }
    }
    r.push_back(std::move(n));
  }
  return r;
}

std::string to_text(const std::vector<LibraryNodePlan>& plan) {
  std::string r;
  for (const LibraryNodePlan& n : plan)
    r += fmt::format("blas{} (step {}): {}{}\n", n.blas, n.step, to_string(n.how), n.why.empty() ? "" : " (" + n.why + ")");
  return r;
}

ArenaLayout plan_arena(const CudaProgram& p, std::span<const int64_t> upper) {
  ArenaLayout l;
  const size_t nb = p.buffers.buffers.size();
  l.offset.assign(nb, -1);
  l.capacity.assign(nb, 0);
  l.slot_offset.assign(p.buffers.slots.size(), -1);
  int64_t at = 0;
  for (size_t s = 0; s < p.buffers.slots.size(); ++s) {
    const Slot& slot = p.buffers.slots[s];
    bool any = false;
    for (int m : slot.members) any |= in_arena(p, p.buffers.buffers[static_cast<size_t>(m)]);
    if (!any) continue;
    const int64_t bytes = std::max<int64_t>(eval_size(slot.bytes, p.symbols, upper), 1);
    at = align_up(at, std::max<int64_t>(slot.alignment, kBufferAlignment));
    l.slot_offset[s] = at;
    for (int m : slot.members) {
      if (!in_arena(p, p.buffers.buffers[static_cast<size_t>(m)])) continue;
      l.offset[static_cast<size_t>(m)] = at;
      l.capacity[static_cast<size_t>(m)] = bytes;
    }
    at += bytes;
  }
  for (const PlannedBuffer& b : p.buffers.buffers) {
    if (!in_arena(p, b) || b.slot >= 0) continue;
    const int64_t bytes = std::max<int64_t>(eval_size(b.bytes, p.symbols, upper), 1);
    at = align_up(at, kBufferAlignment);
    l.offset[static_cast<size_t>(b.id)] = at;
    l.capacity[static_cast<size_t>(b.id)] = bytes;
    at += bytes;
  }
  l.bytes = at;
  return l;
}

std::vector<GraphSegment> graph_segments(const CudaProgram& p) { return graph_segments(p, library_plan(p)); }

std::vector<GraphSegment> graph_segments(const CudaProgram& p, const std::vector<LibraryNodePlan>& library) {
  std::vector<GraphSegment> r;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    bool recorded = p.steps[i].kind == StepKind::Kernel;
    if (p.steps[i].kind == StepKind::Blas)
      for (const LibraryNodePlan& n : library)
        if (n.step == i) recorded = n.how != LibraryCapture::Plain;
    if (!recorded) continue;
    if (!r.empty() && r.back().end == i) {
      r.back().end = i + 1;
    } else {
      r.push_back({i, i + 1});
    }
  }
  return r;
}

std::vector<GraphSegment> pipeline_chunks(const std::vector<GraphSegment>& segments, size_t first, double growth) {
  std::vector<GraphSegment> r;
  for (const GraphSegment& s : segments) {
    size_t at = s.first;
    double size = static_cast<double>(std::max<size_t>(first, 1));
    while (at < s.end) {
      const size_t n = std::min(static_cast<size_t>(size), s.end - at);
      r.push_back({at, at + n});
      at += n;
      size *= std::max(growth, 1.0);
    }
  }
  return r;
}

PipelineSetting parse_pipeline_setting(const std::string& text) {
  PipelineSetting r;
  if (text.empty() || text == "1") return r;
  if (text == "0") {
    r.on = false;
    return r;
  }
  auto bad = [&] {
    return ValueError(fmt::format("PROTEAN_CUDA_GRAPH_PIPELINE={}: expected 1 (graph segments split into growing chunks of "
                                  "{} steps growing {}x, the default), 0 (one graph per segment) or FIRST,GROWTH (chunks "
                                  "of FIRST steps, 1..4096, growing GROWTH times, 1..16; e.g. 8,1.75)",
                                  text, kPipelineFirstChunk, kPipelineGrowth));
  };
  const size_t comma = text.find(',');
  if (comma == std::string::npos) throw bad();
  try {
    size_t used = 0;
    const std::string f = text.substr(0, comma), g = text.substr(comma + 1);
    const long first = std::stol(f, &used);
    if (used != f.size()) throw bad();
    const double growth = std::stod(g, &used);
    if (used != g.size()) throw bad();
    if (first < 1 || first > 4096 || !(growth >= 1.0 && growth <= 16.0)) throw bad();
    r.first = static_cast<size_t>(first);
    r.growth = growth;
  } catch (const std::logic_error&) {  // stol / stod: not a number, out of range
    throw bad();
  }
  return r;
}

std::vector<NodePatchPlan> patch_plan(const CudaProgram& p) {
  std::vector<NodePatchPlan> r;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (p.steps[i].kind != StepKind::Kernel) continue;
    NodePatchPlan n;
    n.step = i;
    n.kernel = p.steps[i].index;
    const CudaKernel& k = p.kernels[static_cast<size_t>(n.kernel)];
    for (size_t a = 0; a < k.params.size(); ++a) {
      const KernelParam& kp = k.params[a];
      if (kp.kind == ParamKind::Symbol) {
        n.symbol_params.push_back(static_cast<int>(a));
      } else if (kp.kind == ParamKind::Sizes || in_arena(p, p.buffers.buffers[static_cast<size_t>(kp.index)])) {
        n.arena_params.push_back(static_cast<int>(a));
      } else if (is_constant_buffer(p, kp.index)) {
        n.constant_params.push_back(static_cast<int>(a));
      } else {
        n.io_params.push_back(static_cast<int>(a));
      }
    }
    n.grid_varies = uses_symbol(k.general.launch.work) || uses_symbol(k.aligned.launch.work);
    n.grid_at_bound = n.grid_varies && sizes_from_memory(k);
    r.push_back(std::move(n));
  }
  return r;
}

std::string to_text(const std::vector<NodePatchPlan>& plan, const CudaProgram& p) {
  std::string r;
  auto list = [](const char* what, const std::vector<int>& v) {
    std::string s = fmt::format("; {}", what);
    if (v.empty()) return s + " -";
    for (int i : v) s += fmt::format(" p{}", i);
    return s;
  };
  for (const NodePatchPlan& n : plan) {
    r += fmt::format("{} (step {}){}{}{}{}\n", p.kernels[static_cast<size_t>(n.kernel)].name, n.step,
                     list("sizes", n.symbol_params), list("io", n.io_params), list("constants", n.constant_params)
                         + list("arena", n.arena_params),
                     n.grid_at_bound ? "; grid at the bucket's bound" : n.grid_varies ? "; grid varies" : "; grid fixed");
  }
  return r;
}

SizeTable size_table(const CudaProgram& p) {
  SizeTable t;
  std::unordered_map<sym::Expr, int> index;
  auto add = [&](const sym::Expr& e) -> int {
    if (!e) return -1;
    auto [it, fresh] = index.emplace(e, static_cast<int>(t.exprs.size()));
    if (fresh) t.exprs.push_back(e);
    return it->second;
  };
  for (const CudaKernel& k : p.kernels) {
    SizeTable::Kernel tk;
    const KernelVariant* v[2] = {&k.general, &k.aligned};
    for (int i = 0; i < 2; ++i) {
      tk.work[i] = add(v[i]->launch.work);
      tk.row[i] = v[i]->launch.row_capacity > 0 ? add(v[i]->launch.row_length) : -1;
    }
    for (const sym::Expr& e : k.rule.divisible) tk.divisible.push_back(add(e));
    if (k.rule.size) tk.at_least = add(k.rule.size);
    for (const TuneVariant& v : k.tune) {
      SizeTable::Kernel::Tune tt;
      tt.work = add(v.variant.launch.work);
      tt.row = v.variant.launch.row_capacity > 0 ? add(v.variant.launch.row_length) : -1;
      for (const sym::Expr& e : v.rule.divisible) tt.divisible.push_back(add(e));
      tk.tune.push_back(std::move(tt));
    }
    t.kernels.push_back(std::move(tk));
  }
  t.buffer_bytes.assign(p.buffers.buffers.size(), -1);
  for (const PlannedBuffer& b : p.buffers.buffers) t.buffer_bytes[static_cast<size_t>(b.id)] = add(b.bytes);
  for (const BlasStep& b : p.blas)
    t.blas.push_back({add(b.batch), add(b.m), add(b.n), add(b.k), add(b.batch_stride_a), add(b.batch_stride_b)});
  t.program = compile_sizes(t.exprs, p.symbols);
  return t;
}

SizeProgram compile_sizes(const std::vector<sym::Expr>& exprs, const std::vector<sym::Expr>& symbols) {
  using Op = SizeProgram::Op;
  SizeProgram prog;
  std::unordered_map<sym::Expr, int32_t> reg;     // nodes emitted: their register
  std::unordered_map<sym::Expr, int32_t> result;  // exprs[i] → i (its fixed register)
  for (size_t i = 0; i < exprs.size(); ++i) result.emplace(exprs[i], static_cast<int32_t>(i));
  int32_t next = static_cast<int32_t>(exprs.size());
  auto emit = [&](auto&& self, sym::Expr e) -> int32_t {
    if (auto it = reg.find(e); it != reg.end()) return it->second;
    std::vector<int32_t> in;
    in.reserve(e->args.size());
    for (sym::Expr a : e->args) in.push_back(self(self, a));
    auto rit = result.find(e);
    const int32_t dst = rit != result.end() ? rit->second : next++;
    auto push = [&](Op op, int32_t to, int32_t a = 0, int32_t b = 0, int64_t imm = 0, sym::Expr what = nullptr) {
      prog.code.push_back({op, to, a, b, imm, what});
    };
    // n-ary kinds fold left into binary instructions; the last one writes dst
    auto fold = [&](Op op) {
      if (in.size() == 1) {
        push(op == Op::And || op == Op::Or ? op : Op::Move, dst, in[0], in[0]);
        return;
      }
      int32_t acc = in[0];
      for (size_t i = 1; i < in.size(); ++i) {
        const int32_t to = i + 1 == in.size() ? dst : next++;
        push(op, to, acc, in[i]);
        acc = to;
      }
    };
    switch (e->kind) {
      case sym::Kind::Integer: push(Op::Const, dst, 0, 0, e->value); break;
      case sym::Kind::True: push(Op::Const, dst, 0, 0, 1); break;
      case sym::Kind::False: push(Op::Const, dst, 0, 0, 0); break;
      case sym::Kind::Symbol: {
        int64_t index = -1;
        for (size_t i = 0; i < symbols.size() && index < 0; ++i)
          if (symbols[i] == e) index = static_cast<int64_t>(i);
        push(index >= 0 ? Op::Load : Op::Unbound, dst, 0, 0, index, e);
        break;
      }
      case sym::Kind::Add: fold(Op::Add); break;
      case sym::Kind::Mul: fold(Op::Mul); break;
      case sym::Kind::Max: fold(Op::Max); break;
      case sym::Kind::Min: fold(Op::Min); break;
      case sym::Kind::And: fold(Op::And); break;
      case sym::Kind::Or: fold(Op::Or); break;
      case sym::Kind::Pow: push(Op::Pow, dst, in[0], in[1]); break;
      case sym::Kind::FloorDiv: push(Op::FloorDiv, dst, in[0], in[1]); break;
      case sym::Kind::CeilDiv: push(Op::CeilDiv, dst, in[0], in[1]); break;
      case sym::Kind::Mod: push(Op::Mod, dst, in[0], in[1]); break;
      case sym::Kind::Eq: push(Op::Eq, dst, in[0], in[1]); break;
      case sym::Kind::Ne: push(Op::Ne, dst, in[0], in[1]); break;
      case sym::Kind::Lt: push(Op::Lt, dst, in[0], in[1]); break;
      case sym::Kind::Le: push(Op::Le, dst, in[0], in[1]); break;
      case sym::Kind::Gt: push(Op::Gt, dst, in[0], in[1]); break;
      case sym::Kind::Ge: push(Op::Ge, dst, in[0], in[1]); break;
      case sym::Kind::Not: push(Op::Not, dst, in[0], in[0]); break;
    }
    reg.emplace(e, dst);
    return dst;
  };
  for (size_t i = 0; i < exprs.size(); ++i) {
    const int32_t r = emit(emit, exprs[i]);
    if (r != static_cast<int32_t>(i)) prog.code.push_back({Op::Move, static_cast<int32_t>(i), r, r, 0, nullptr});  // a repeat
  }
  prog.registers = static_cast<size_t>(next);
  return prog;
}

void evaluate_sizes(const SizeTable& t, const std::vector<sym::Expr>& symbols, std::span<const int64_t> S,
                    std::vector<int64_t>& values) {
  using Op = SizeProgram::Op;
  const SizeProgram& prog = t.program;
  if (values.size() < prog.registers) values.resize(prog.registers);
  int64_t* r = values.data();
  for (const SizeProgram::Insn& i : prog.code) {
    const int64_t a = r[i.a], b = r[i.b];
    int64_t& d = r[i.dst];
    switch (i.op) {
      case Op::Const: d = i.imm; break;
      case Op::Load:
        if (static_cast<size_t>(i.imm) >= S.size()) {
          // no value for this symbol: the reference evaluation throws eval_size's error, naming the size
          for (const sym::Expr& e : t.exprs) eval_size(e, symbols, S);
          throw ShapeError(fmt::format("cuda program: symbol {} has no bound value ({} symbols bound)", sym::print(i.what), S.size()));
        }
        d = S[static_cast<size_t>(i.imm)];
        break;
      case Op::Unbound:
        for (const sym::Expr& e : t.exprs) eval_size(e, symbols, S);
        throw ShapeError(fmt::format("cuda program: symbol {} has no bound value", sym::print(i.what)));
      case Op::Move: d = a; break;
      case Op::Add: d = sym::checked_add(a, b); break;
      case Op::Mul: d = sym::checked_mul(a, b); break;
      case Op::FloorDiv: d = sym::floordiv_int(a, b); break;
      case Op::CeilDiv: d = -sym::floordiv_int(-a, b); break;
      case Op::Mod: d = sym::mod_int(a, b); break;
      case Op::Max: d = std::max(a, b); break;
      case Op::Min: d = std::min(a, b); break;
      case Op::Pow: d = sym::checked_pow(a, b); break;
      case Op::Eq: d = a == b; break;
      case Op::Ne: d = a != b; break;
      case Op::Lt: d = a < b; break;
      case Op::Le: d = a <= b; break;
      case Op::Gt: d = a > b; break;
      case Op::Ge: d = a >= b; break;
      case Op::And: d = a != 0 && b != 0; break;
      case Op::Or: d = a != 0 || b != 0; break;
      case Op::Not: d = a == 0; break;
    }
  }
}

/// Kernel `k`'s launch work and row length (its aligned or general variant's rule) in the size table's
/// `values`: what launch_dims_at takes.
static std::pair<int64_t, int64_t> launch_work_row(const SizeTable& t, std::span<const int64_t> values, size_t k,
                                                   bool aligned) {
  const SizeTable::Kernel& tk = t.kernels[k];
  const int v = aligned ? 1 : 0;
  return {tk.work[v] >= 0 ? values[static_cast<size_t>(tk.work[v])] : 1,
          tk.row[v] >= 0 ? values[static_cast<size_t>(tk.row[v])] : 0};
}

LaunchDims launch_dims_of(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k,
                          bool aligned) {
  const LaunchRule& rule = aligned ? p.kernels[k].aligned.launch : p.kernels[k].general.launch;
  const auto [work, row] = launch_work_row(t, values, k, aligned);
  return launch_dims_at(rule, work, row);
}

bool sizes_allow_aligned(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k) {
  const CudaKernel& kern = p.kernels[k];
  if (kern.aligned.entry == kern.general.entry) return false;
  const int64_t m = std::max<int64_t>(kern.rule.multiple, 1);
  for (int i : t.kernels[k].divisible)
    if (values[static_cast<size_t>(i)] % m != 0) return false;
  const int at = t.kernels[k].at_least;
  return at < 0 || values[static_cast<size_t>(at)] >= kern.rule.at_least;
}

bool sizes_allow_tune_variant(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k, size_t v) {
  const int64_t m = std::max<int64_t>(p.kernels[k].tune[v].rule.multiple, 1);
  for (int i : t.kernels[k].tune[v].divisible)
    if (values[static_cast<size_t>(i)] % m != 0) return false;
  return true;
}

/// What the launch of a node whose arguments carry no size and no input or output address follows at
/// some sizes (GraphRunner::run's new-size skip): the variants the sizes allow (bit 0 the aligned entry,
/// bit 1 the bucket's tuned variant, `variant` 1-based as Bucket::variant), and the work and row length
/// of the launch rule and of the tuned variant's rule at the dims the node launches with (`dv`). Every
/// address such a node reads is fixed in its bucket, so equal keys mean equal launches.
struct NodeLaunchKey {
  int8_t variants = -1;  ///< -1: none computed yet
  int64_t work = -1, row = -1, tune_work = -1, tune_row = -1;
  bool operator==(const NodeLaunchKey&) const = default;
};

/// Tuned variant `v` of kernel `k`: its launch work and row length in `values` (launch_work_row's twin).
static std::pair<int64_t, int64_t> tune_work_row(const SizeTable& t, std::span<const int64_t> values, size_t k, size_t v) {
  const SizeTable::Kernel::Tune& tt = t.kernels[k].tune[v];
  return {tt.work >= 0 ? values[static_cast<size_t>(tt.work)] : 1, tt.row >= 0 ? values[static_cast<size_t>(tt.row)] : 0};
}

LaunchDims tune_launch_dims_of(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k, size_t v) {
  const auto [work, row] = tune_work_row(t, values, k, v);
  return launch_dims_at(p.kernels[k].tune[v].variant.launch, work, row);
}

static NodeLaunchKey node_launch_key(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values,
                                     std::span<const int64_t> dv, size_t k, int variant) {
  NodeLaunchKey key;
  const bool aligned = sizes_allow_aligned(p, t, values, k);
  std::tie(key.work, key.row) = launch_work_row(t, dv, k, aligned);
  key.variants = aligned ? 1 : 0;
  if (variant > 0) {
    const size_t v = static_cast<size_t>(variant - 1);
    if (sizes_allow_tune_variant(p, t, values, k, v)) key.variants = static_cast<int8_t>(key.variants | 2);
    std::tie(key.tune_work, key.tune_row) = tune_work_row(t, dv, k, v);
  }
  return key;
}

BlasShape blas_shape_of(const SizeTable& t, std::span<const int64_t> values, size_t i) {
  const SizeTable::Blas& b = t.blas[i];
  auto at = [&](int j, int64_t otherwise) { return j >= 0 ? values[static_cast<size_t>(j)] : otherwise; };
  BlasShape r;
  r.batch = at(b.batch, 1);
  r.m = at(b.m, 0);
  r.n = at(b.n, 0);
  r.k = at(b.k, 0);
  r.stride_a = at(b.stride_a, r.m * r.k);
  r.stride_b = at(b.stride_b, r.k * r.n);
  return r;
}

std::vector<dynamic::Bucket> bucket_key(const dynamic::BucketPolicy& policy,
                                        const std::vector<BackendInput::SymbolRange>& ranges,
                                        std::span<const int64_t> symbol_values) {
  std::vector<dynamic::Bucket> key;
  key.reserve(symbol_values.size());
  for (size_t i = 0; i < symbol_values.size(); ++i) {
    dynamic::SizeRange r;
    if (i < ranges.size()) r = {ranges[i].min, ranges[i].max, {}};
    key.push_back(policy.bucket_of(symbol_values[i], r));
  }
  return key;
}

// ---- runner ----------------------------------------------------------------------------------------

struct GraphRunner::Bucket {
  std::vector<dynamic::Bucket> key;
  std::vector<int64_t> upper;
  ArenaLayout layout;
  std::shared_ptr<Storage> arena;
  uint64_t base = 0;
  struct Node {
    drv::CUgraphNode node = nullptr;
    const NodePatchPlan* plan = nullptr;    ///< kernel nodes
    const LibraryNodePlan* lib = nullptr;   ///< library nodes (a child graph, or `flat`)
    bool flat = false;                      ///< a library call's one kernel, added as a kernel node
    BlasShape shape;                        ///< library nodes: the shape captured
    std::vector<uint64_t> block;  ///< the argument values last given to the driver
    std::vector<void*> params;    ///< addresses of block's fields
    drv::KernelNodeParams applied;
    /// A kernel node whose arguments carry no size and no input or output address: what its launch was
    /// last computed from, set when the node is recorded and when a new size recomputes it. A new size
    /// with the same key is skipped.
    NodeLaunchKey launch_key;
  };
  struct Segment {
    drv::CUgraph graph = nullptr;
    drv::CUgraphExec exec = nullptr;
    std::vector<Node> nodes;
  };
  std::vector<Segment> segments;
  std::vector<BlasShape> padded;      ///< per library_ entry: the shape at the upper bounds (Padded)
  std::vector<int64_t> upper_values;  ///< the size table at the upper bounds
  /// per kernel: launched at the upper bounds (NodePatchPlan::grid_at_bound, and both variants' launch
  /// rules accept the upper bounds), so a new size inside the bucket changes neither grid nor arguments
  std::vector<bool> at_bound;
  /// prepare's checks of this bucket: per distinct symbolic byte size of the arena's buffers (an index
  /// into the size table), the smallest region holding such a buffer (and that buffer, for the hint);
  /// per check_library_ entry the padded row count (INT64_MAX for exact calls); the first padded call
  /// whose operands' regions do not hold its padded rows (-1: none), which keeps the bucket plain.
  struct Fit {
    int32_t expr = 0;
    int32_t id = 0;
    int64_t cap = 0;
  };
  std::vector<Fit> fits;
  std::vector<int64_t> pad_m;
  int misfit_blas = -1;
  int64_t misfit_m = 0;
  std::vector<int64_t> output_bytes;  ///< per buffer id: a graph output's bytes at the upper bounds (else 0)
  /// Graph inputs that kernel nodes read and that are small (kStagedInputBytes at the upper bounds):
  /// per buffer id its offset in `staging`, where each call copies it before the first launch, so the
  /// nodes never change for a new input address (-1: not staged).
  std::vector<int64_t> staged;
  std::shared_ptr<Storage> staging;
  uint64_t staging_base = 0;
  /// The address a node of this bucket reads buffer `id` at: its staging copy, or `address(id)`.
  template <class Address> uint64_t node_address(const Address& address, int id) const {
    const int64_t off = id >= 0 && static_cast<size_t>(id) < staged.size() ? staged[static_cast<size_t>(id)] : -1;
    return off >= 0 ? staging_base + static_cast<uint64_t>(off) : address(id);
  }
  size_t index = 0;                   ///< 1-based, in order of creation (logs)
  bool recorded = false;              ///< segments hold the instantiated graphs
  /// Background recording: 0 none yet, 1 queued or running on the worker, 2 ready, 3 failed. The
  /// worker writes the segments, then publishes 2 (release); calls read it (acquire).
  std::atomic<int> state{0};
  std::vector<int64_t> last_sizes;    ///< S of the previous call (empty before the first)
  // max-autotune: the winners (tune)
  bool tuned = false;
  /// per library_ entry: cuBLASLt algorithm index, -1 = the untuned choice (the generated product, with
  /// its LayerNorm folded in where it has one, or the heuristic's first), kGeneratedUnfolded
  std::vector<int> lib_algo;
  std::vector<uint32_t> threads;      ///< per kernel: threads per row, 0 = the launch rule's
  std::vector<int> variant;           ///< per kernel: 0 its own entry, i > 0 CudaKernel::tune[i - 1]
  std::vector<drv::CUfunction> variant_fn;  ///< per kernel: the function of `variant` (> 0)
};

struct GraphRunner::Shared {
  std::mutex mu;                  ///< held by a recording on the worker for its whole length
  GraphRunner* runner = nullptr;  ///< null once the runner is gone: queued recordings do nothing
};

GraphRunner::GraphRunner(const CudaProgram& p, const BackendInput& in, int device,
                         std::vector<std::pair<drv::CUfunction, drv::CUfunction>> functions, uint64_t sizes_address)
    : p_(p), in_(in), device_(device), functions_(std::move(functions)), sizes_address_(sizes_address),
      policy_(dynamic::BucketPolicy::parse(in.buckets.policy, "BackendInput::buckets.policy")),
      library_(library_plan(p)), segments_(graph_segments(p, library_)), plan_(patch_plan(p)), table_(size_table(p)),
      shared_(std::make_shared<Shared>()) {
  shared_->runner = this;
  programmatic_ = programmatic_launch(device);
  // One kernel per distinct launch (a model's repeated layers launch theirs alike: the same rules over
  // the same hash-consed expressions), so the check reads a few kernels, not every node's.
  auto same_launch = [](const CudaKernel& x, const CudaKernel& y) {
    return x.general.launch == y.general.launch && x.aligned.launch == y.aligned.launch;
  };
  // both opt-in: measured slower or no faster on an H200 (docs/graphs.md)
  stage_ = observe::env_opt_in("PROTEAN_CUDA_GRAPH_STAGE_INPUTS");
  flatten_ = observe::env_opt_in("PROTEAN_CUDA_GRAPH_FLAT_LIBRARY");
  if (stage_)
    for (const NodePatchPlan& n : plan_)
      for (int a : n.io_params) {
        const int id = p.kernels[static_cast<size_t>(n.kernel)].params[static_cast<size_t>(a)].index;
        if (p.buffers.buffers[static_cast<size_t>(id)].kind == loop::BufferKind::Input &&
            std::find(stage_inputs_.begin(), stage_inputs_.end(), id) == stage_inputs_.end())
          stage_inputs_.push_back(id);
      }
  for (const NodePatchPlan& n : plan_) {
    const CudaKernel& k = p.kernels[static_cast<size_t>(n.kernel)];
    if (std::none_of(check_kernels_.begin(), check_kernels_.end(),
                     [&](uint32_t c) { return same_launch(p.kernels[c], k); }))
      check_kernels_.push_back(static_cast<uint32_t>(n.kernel));
  }
  for (size_t i = 0; i < library_.size(); ++i) {
    const LibraryNodePlan& n = library_[i];
    has_exact_ = has_exact_ || n.how == LibraryCapture::Exact;
    if (n.how == LibraryCapture::Plain) continue;
    const SizeTable::Blas& tb = table_.blas[static_cast<size_t>(n.blas)];
    check_library_.push_back({tb.batch, tb.m, tb.n, n.blas, static_cast<uint32_t>(i), n.how == LibraryCapture::Padded});
  }
  const char* pipe = std::getenv("PROTEAN_CUDA_GRAPH_PIPELINE");
  const PipelineSetting ps = parse_pipeline_setting(pipe ? pipe : "");
  pipeline_ = ps.on;
  // Kernels that read their sizes from memory keep their nodes at a new size: unless the variable asks
  // for chunks, one graph per segment (the chunks exist to hide patches that no longer happen).
  const bool nothing_to_patch = std::all_of(plan_.begin(), plan_.end(), [](const NodePatchPlan& n) {
    return n.symbol_params.empty() && (!n.grid_varies || n.grid_at_bound);
  });
  if (nothing_to_patch && !(pipe && *pipe)) pipeline_ = false;
  if (pipeline_) segments_ = pipeline_chunks(segments_, ps.first, ps.growth);
  autotune_ = in.mode == "max-autotune";
  // max-autotune times its candidates on the device while it records a bucket: on the compile worker
  // the program's own calls (plain launches until the graph is ready) ran beside the timings, which
  // then timed them too, and the calls ran plain for as long as the tuning took (GPT-2 small on an
  // H100: 1116 of 1196 steady calls plain, 0.74-0.86 ms each against 0.37-0.54 ms replayed). So a new
  // bucket is tuned and recorded on the calling thread, before its first replay: that call waits.
  if (autotune_) background_ = false;
  if (const char* e = std::getenv("PROTEAN_CUDA_GRAPH_RECORD"); e && *e) {
    const std::string v = e;
    if (v != "inline" && v != "worker")
      throw ValueError(fmt::format("PROTEAN_CUDA_GRAPH_RECORD={}: expected 'worker' (record a new bucket's graph on the "
                                   "compile worker, the default) or 'inline' (on the calling thread)",
                                   v));
    background_ = v == "worker";
  }
  if (const char* e = std::getenv("PROTEAN_CUDA_GRAPH_UPLOAD"); e && *e) {
    const std::string v = e;
    if (v != "recording" && v != "launch" && v != "off")
      throw ValueError(fmt::format("PROTEAN_CUDA_GRAPH_UPLOAD={}: expected 'recording' (upload a recorded graph on the "
                                   "stream that recorded it, the default), 'launch' (on the stream its calls launch it on) "
                                   "or 'off' (its first launch uploads it)",
                                   v));
    upload_on_launch_stream_ = v == "launch";
    upload_ = v != "off";
  }
  if (observe::log_enabled(observe::LogCat::Graphs)) {
    std::string text = fmt::format("cuda graphs for '{}': {} kernel node(s), {} library node(s) in {} segment(s), bucket policy {}",
                                   p.name, plan_.size(), library_.size(), segments_.size(), policy_.str());
    for (size_t i = 0; i < p.symbols.size(); ++i) {
      dynamic::SizeRange r;
      if (i < in.buckets.ranges.size()) r = {in.buckets.ranges[i].min, in.buckets.ranges[i].max, in.buckets.ranges[i].why};
      text += "\n    " + dynamic::describe_buckets(sym::print(p.symbols[i]), policy_, r);
    }
    text += "\n" + to_text(plan_, p) + to_text(library_);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    observe::log_line(observe::LogCat::Graphs, in.compile_id, text);
  }
  size_t plain = 0, exact = 0;
  std::string plain_why, exact_why;
  for (const LibraryNodePlan& n : library_) {
    std::string& why = n.how == LibraryCapture::Plain ? plain_why : exact_why;
    if (n.how == LibraryCapture::Plain) ++plain;
    if (n.how == LibraryCapture::Exact) ++exact;
    if (n.how != LibraryCapture::Padded && why.empty()) why = fmt::format("blas{}: {}", n.blas, n.why);
  }
  if (plain || !p.host.empty())
    hint(fmt::format("the graph is split into {} segment(s) around {} cuBLASLt and {} host step(s), which run as plain "
                     "calls between segment launches ({})",
                     segments_.size(), plain, p.host.size(), plain_why.empty() ? "host steps are not recorded" : plain_why));
  if (exact)
    hint(fmt::format("{} cuBLASLt call(s) are captured at their exact shape and captured again when it changes inside "
                     "a bucket ({})",
                     exact, exact_why));
}

void GraphRunner::destroy_graphs(Bucket& b) {
  const drv::DriverApi* api = drv::driver();
  if (!api) return;
  for (auto& s : b.segments) {
    if (s.exec) api->cuGraphExecDestroy(s.exec);
    if (s.graph) api->cuGraphDestroy(s.graph);
  }
  b.segments.clear();
  b.recorded = false;
}

GraphRunner::~GraphRunner() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);  // waits for a recording in flight
    shared_->runner = nullptr;
  }
  for (auto& b : buckets_) destroy_graphs(*b);
  const drv::DriverApi* api = drv::driver();
  if (api)
    for (drv::CUmodule m : tune_modules_.modules) api->cuModuleUnload(m);
  if (api && capture_stream_) api->cuStreamDestroy(capture_stream_);
  if (api && worker_stream_) api->cuStreamDestroy(worker_stream_);
}

int64_t graph_max_buckets() { return observe::env_int("PROTEAN_CUDA_GRAPH_MAX_BUCKETS", 64, 1, 1 << 20); }

void GraphRunner::hint(const std::string& reason) {
  std::lock_guard<std::mutex> lock(hint_mu_);
  if (std::find(hinted_.begin(), hinted_.end(), reason) != hinted_.end()) return;
  hinted_.push_back(reason);
  if (observe::log_enabled(observe::LogCat::PerfHints))
    observe::log_line(observe::LogCat::PerfHints, in_.compile_id, fmt::format("cuda graphs ('{}'): {}", p_.name, reason));
}

std::span<const int64_t> GraphRunner::size_values(std::span<const int64_t> S) {
  // `values_valid_`, not an empty values_at_: a program without symbols has S empty at every call.
  if (!values_valid_ || values_at_.size() != S.size() || !std::equal(S.begin(), S.end(), values_at_.begin())) {
    values_valid_ = false;  // stays false if the evaluation throws
    evaluate_sizes(table_, p_.symbols, S, values_);
    values_at_.assign(S.begin(), S.end());
    values_valid_ = true;
  }
  return values_;
}

size_t GraphRunner::buckets() const { return buckets_.size(); }
const ArenaLayout& GraphRunner::layout() const { return current_->layout; }
int64_t GraphRunner::output_capacity(int id) const { return current_->output_bytes[static_cast<size_t>(id)]; }

uint64_t GraphRunner::prepare(std::span<const int64_t> S) {
  if (plan_.empty() && segments_.empty()) {
    hint("no generated kernels or library calls to record: plain calls");
    count_graph_plain_run();
    return 0;
  }
  key_.resize(S.size());
  for (size_t i = 0; i < S.size(); ++i) {
    dynamic::SizeRange r;
    if (i < in_.buckets.ranges.size()) r = {in_.buckets.ranges[i].min, in_.buckets.ranges[i].max, {}};
    key_[i] = policy_.bucket_of(S[i], r);
  }
  const std::vector<dynamic::Bucket>& key = key_;
  Bucket* b = current_ && current_->key == key ? current_ : nullptr;
  if (!b)
    for (auto& c : buckets_)
      if (c->key == key) b = c.get();
  if (!b && static_cast<int64_t>(buckets_.size()) >= graph_max_buckets()) {
    // each bucket holds an arena and its graphs: past the cap, sizes of new buckets run plain
    hint(fmt::format("{} size buckets recorded (PROTEAN_CUDA_GRAPH_MAX_BUCKETS): sizes outside them run plain launches",
                     buckets_.size()));
    count_graph_plain_run();
    to_record_ = nullptr;
    return 0;
  }
  if (!b) {
    auto nb = std::make_shared<Bucket>();
    nb->key = key;
    nb->index = buckets_.size() + 1;
    for (const auto& k : key) nb->upper.push_back(k.hi);
    nb->layout = plan_arena(p_, nb->upper);
    evaluate_sizes(table_, p_.symbols, nb->upper, nb->upper_values);
    nb->at_bound.assign(p_.kernels.size(), false);
    for (const NodePatchPlan& n : plan_) {
      if (!n.grid_at_bound) continue;
      const size_t k = static_cast<size_t>(n.kernel);
      try {  // a launch rule may refuse the bound (a row longer than the registers hold): exact grids then
        (void)launch_dims_of(p_, table_, nb->upper_values, k, false);
        if (p_.kernels[k].aligned.entry != p_.kernels[k].general.entry) (void)launch_dims_of(p_, table_, nb->upper_values, k, true);
        for (size_t v = 0; v < p_.kernels[k].tune.size(); ++v) (void)tune_launch_dims_of(p_, table_, nb->upper_values, k, v);
        nb->at_bound[k] = true;
      } catch (const Error&) {
      }
    }
    for (const LibraryNodePlan& n : library_)
      nb->padded.push_back(n.how == LibraryCapture::Padded ? blas_shape(p_.blas[static_cast<size_t>(n.blas)], p_.symbols, nb->upper)
                                                           : BlasShape{});
    for (const PlannedBuffer& pb : p_.buffers.buffers) {
      const int64_t cap = nb->layout.capacity[static_cast<size_t>(pb.id)];
      const int32_t e = table_.buffer_bytes[static_cast<size_t>(pb.id)];
      if (cap <= 0 || e < 0) continue;  // not in the arena
      auto it = std::find_if(nb->fits.begin(), nb->fits.end(), [&](const Bucket::Fit& f) { return f.expr == e; });
      if (it == nb->fits.end()) nb->fits.push_back({e, pb.id, cap});
      else if (cap < it->cap) *it = {e, pb.id, cap};
    }
    for (const LibraryCheck& c : check_library_) {
      if (!c.padded) {
        nb->pad_m.push_back(std::numeric_limits<int64_t>::max());
        continue;
      }
      const BlasStep& st = p_.blas[static_cast<size_t>(c.blas)];
      const BlasShape& pad = nb->padded[c.lib];
      nb->pad_m.push_back(pad.m);
      const int64_t item = static_cast<int64_t>(itemsize(st.dtype));
      auto fits = [&](int id, int64_t bytes) {  // (no operand: -1)
        return id < 0 || is_constant_buffer(p_, id) || nb->layout.capacity[static_cast<size_t>(id)] >= bytes;
      };
      if (nb->misfit_blas < 0 && (!fits(st.a, pad.m * pad.k * item) || !fits(st.out, pad.m * pad.n * item) ||
                                  !fits(st.epilogue.residual, pad.m * pad.n * item) ||
                                  !fits(st.prologue.x, pad.m * pad.k * item))) {
        nb->misfit_blas = c.blas;
        nb->misfit_m = pad.m;
      }
    }
    nb->staged.assign(p_.buffers.buffers.size(), -1);
    int64_t staged_bytes = 0;
    for (int id : stage_inputs_) {
      const int64_t bytes = eval_size(p_.buffers.buffers[static_cast<size_t>(id)].bytes, p_.symbols, nb->upper);
      const int32_t e = table_.buffer_bytes[static_cast<size_t>(id)];
      if (bytes <= 0 || bytes > kStagedInputBytes || e < 0) continue;
      nb->staged[static_cast<size_t>(id)] = staged_bytes;
      nb->fits.push_back({e, id, bytes});  // a call's input must fit its copy's region
      staged_bytes = align_up(staged_bytes + bytes, kBufferAlignment);
    }
    if (staged_bytes > 0) {
      nb->staging = std::make_shared<Storage>(static_cast<size_t>(staged_bytes), Device{DeviceType::CUDA, device_});
      nb->staging_base = reinterpret_cast<uint64_t>(nb->staging->data());
    }
    nb->output_bytes.assign(p_.buffers.buffers.size(), 0);
    for (int id : p_.buffers.outputs)
      nb->output_bytes[static_cast<size_t>(id)] = eval_size(p_.buffers.buffers[static_cast<size_t>(id)].bytes, p_.symbols, nb->upper);
    nb->arena = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(nb->layout.bytes, 1)),
                                          Device{DeviceType::CUDA, device_});
    nb->base = reinterpret_cast<uint64_t>(nb->arena->data());
    b = nb.get();
    buckets_.push_back(std::move(nb));
    count_graph_bucket(in_.compile_id);
    if (observe::log_enabled(observe::LogCat::Graphs)) {
      std::string ks;
      for (size_t i = 0; i < key.size(); ++i)
        ks += fmt::format("{}{} in {}", i ? ", " : "", sym::print(p_.symbols[i]), key[i].str());
      observe::log_line(observe::LogCat::Graphs, in_.compile_id,
                        fmt::format("new bucket {} of '{}' ({} so far): arena {} bytes at the upper bounds", ks,
                                    p_.name, buckets_.size(), b->layout.bytes));
    }
  }
  // Sizes changed: every launch must have work, every temporary must fit its arena region, every
  // padded library call must cover the call's rows within its operands' regions.
  change_check_ns_ = -1;
  if (b->last_sizes.size() != S.size() || !std::equal(S.begin(), S.end(), b->last_sizes.begin())) {
    const auto t0 = std::chrono::steady_clock::now();
    change_t0_ = t0;
    const std::span<const int64_t> v = size_values(S);
    for (const uint32_t ki : check_kernels_) {
      if (launch_dims_of(p_, table_, v, ki, false).grid == 0 || launch_dims_of(p_, table_, v, ki, true).grid == 0) {
        hint(fmt::format("{} has no work at these sizes (an empty grid cannot be a graph node): plain launches", p_.kernels[ki].name));
        count_graph_plain_run();
        return 0;
      }
    }
    for (const Bucket::Fit& f : b->fits) {
      if (v[static_cast<size_t>(f.expr)] > f.cap) {
        hint(fmt::format("buffer {} needs more bytes than at the bucket's upper bounds (its size is not monotone in "
                         "its symbols): plain launches",
                         f.id));
        count_graph_plain_run();
        return 0;
      }
    }
    auto at = [&](int32_t j, int64_t otherwise) { return j >= 0 ? v[static_cast<size_t>(j)] : otherwise; };
    for (size_t i = 0; i < check_library_.size(); ++i) {
      const LibraryCheck& c = check_library_[i];
      const int64_t m = at(c.m, 0);
      if (at(c.batch, 1) == 0 || m == 0 || at(c.n, 0) == 0) {  // BlasShape::empty
        hint(fmt::format("blas{} has no work at these sizes: plain launches", c.blas));
        count_graph_plain_run();
        return 0;
      }
      if (m > b->pad_m[i]) {
        hint(fmt::format("blas{} at the bucket's padded row count {} does not fit its operands' arena regions (m is not "
                         "monotone in its symbols): plain launches",
                         c.blas, b->pad_m[i]));
        count_graph_plain_run();
        return 0;
      }
    }
    if (b->misfit_blas >= 0) {
      hint(fmt::format("blas{} at the bucket's padded row count {} does not fit its operands' arena regions (m is not "
                       "monotone in its symbols): plain launches",
                       b->misfit_blas, b->misfit_m));
      count_graph_plain_run();
      return 0;
    }
    change_check_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  if (background_ && b->state.load(std::memory_order_acquire) != 2) {
    const int st = b->state.load(std::memory_order_acquire);
    if (st == 0) to_record_ = b;
    hint(st == 3 ? "a bucket's recording failed on the compile worker (the warning says why): its calls use plain launches"
                 : "a new bucket's graph is recorded on the compile worker: its calls use plain launches until it is ready");
    count_graph_plain_run();
    return 0;
  }
  current_ = b;
  return b->base;
}

void GraphRunner::after_plain_run(std::span<const int64_t> S, const std::function<uint64_t(int)>& address) {
  Bucket* b = to_record_;
  to_record_ = nullptr;
  if (!b || b->state.load(std::memory_order_acquire) != 0) return;
  std::shared_ptr<Bucket> keep;
  for (auto& c : buckets_)
    if (c.get() == b) keep = c;
  // What the recording needs from this call: the sizes, and every buffer's address in the graph: the
  // arena's regions, the constants; inputs and outputs are patched into their nodes at each replay (0).
  std::vector<uint64_t> addr(p_.buffers.buffers.size(), 0);
  for (const PlannedBuffer& pb : p_.buffers.buffers) {
    const size_t id = static_cast<size_t>(pb.id);
    if (b->layout.offset[id] >= 0) addr[id] = b->base + static_cast<uint64_t>(b->layout.offset[id]);
    else if (pb.kind == loop::BufferKind::Constant) addr[id] = address(pb.id);
  }
  b->state.store(1, std::memory_order_release);
  std::weak_ptr<Shared> shared = shared_;
  std::vector<int64_t> sizes(S.begin(), S.end());
  run_on_compile_worker(
      [shared, keep, sizes = std::move(sizes), addr = std::move(addr)] {
        std::shared_ptr<Shared> s = shared.lock();
        if (!s) return;
        std::lock_guard<std::mutex> lock(s->mu);
        GraphRunner* r = s->runner;
        if (!r) return;
        try {
          r->record(*keep, sizes, [&](int id) { return addr[static_cast<size_t>(id)]; }, r->worker_stream_);
          keep->state.store(2, std::memory_order_release);
        } catch (...) {
          r->destroy_graphs(*keep);
          keep->state.store(3, std::memory_order_release);
          throw;
        }
      },
      fmt::format("CUDA graph recording of '{}' (compile {}, bucket {})", p_.name, in_.compile_id, b->index));
}

drv::CUgraph GraphRunner::capture(const LibraryNodePlan& lib, const BlasShape& shape,
                                  const std::function<uint64_t(int)>& address, drv::CUstream& capture_stream,
                                  int algorithm, const BlasStep* step) {
  const drv::DriverApi& api = drv::require_driver("cuda graphs");
  drv::stream(device_);  // the device's context is current on this thread
  make_capture_stream(api, capture_stream);
  prepare_blas_device(device_);  // handle and workspace: no allocation inside the capture
  drv::check(api.cuStreamBeginCapture(capture_stream, drv::kStreamCaptureModeThreadLocal), "cuStreamBeginCapture");
  drv::CUgraph g = nullptr;
  try {
    run_blas_at(step ? *step : p_.blas[static_cast<size_t>(lib.blas)], shape, address, device_, capture_stream, algorithm);
  } catch (...) {
    if (api.cuStreamEndCapture(capture_stream, &g) == drv::kCudaSuccess && g) api.cuGraphDestroy(g);
    throw;
  }
  drv::check(api.cuStreamEndCapture(capture_stream, &g), fmt::format("cuStreamEndCapture(blas{})", lib.blas));
  return g;
}

void GraphRunner::record(Bucket& b, std::span<const int64_t> S, const std::function<uint64_t(int)>& address,
                         drv::CUstream& capture_stream) {
  const drv::DriverApi& api = drv::require_driver("cuda graphs");
  drv::stream(device_);  // the device's context is current on this thread
  if (autotune_ && !b.tuned) tune(b, address, capture_stream);
  const bool upload = api.cuGraphUpload && upload_;  // each segment's graph, once instantiated (below)
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> values;  // the size table at S (this thread's own: the worker may record while calls run)
  int flattened = 0;            // library calls added as kernel nodes
  std::vector<char> folded(p_.blas.size(), 0);  // per BLAS step: its LayerNorm kernel left out (it computes it)
  // library call li as this bucket records it: the shape it is captured at and its algorithm (lib_algo)
  auto captured = [&](size_t li) {
    const bool padded = library_[li].how == LibraryCapture::Padded;
    const BlasShape shape = padded ? b.padded[li] : blas_shape(p_.blas[static_cast<size_t>(library_[li].blas)], p_.symbols, S);
    return std::pair{shape, padded && li < b.lib_algo.size() ? b.lib_algo[li] : -1};
  };
  for (const GraphSegment& seg : segments_) {
    Bucket::Segment s;
    drv::check(api.cuGraphCreate(&s.graph, 0), "cuGraphCreate");
    b.segments.push_back(s);
    Bucket::Segment& sg = b.segments.back();
    sg.nodes.reserve(seg.end - seg.first);
    for (size_t i = seg.first; i < seg.end; ++i) {
      Bucket::Node node;
      const drv::CUgraphNode dep = sg.nodes.empty() ? nullptr : sg.nodes.back().node;
      const bool after_kernel = dep && (!sg.nodes.back().lib || sg.nodes.back().flat);  // a kernel node ahead
      if (p_.steps[i].kind == StepKind::Blas) {
        size_t li = 0;
        while (library_[li].step != i) ++li;
        node.lib = &library_[li];
        const auto [shape, tuned] = captured(li);
        node.shape = shape;
        const int algorithm = std::max(tuned, -1);
        // a product whose LayerNorm kernel was recorded reads that kernel's output (its prologue off)
        const BlasStep& own = p_.blas[static_cast<size_t>(node.lib->blas)];
        const bool reads_layer_norm = own.has_prologue() && !folded[static_cast<size_t>(node.lib->blas)];
        const BlasStep unfolded = reads_layer_norm ? prologue_off(own) : BlasStep{};
        const BlasStep* step = reads_layer_norm ? &unfolded : &own;
        // a generated product (hopper_gemm.h) is a kernel node of its own, and after another kernel
        // node it hangs on a programmatic edge: it requests its weights while that kernel finishes.
        // Asked before the capture: the first eligible call builds and loads the module, never inside it.
        const bool generated = generated_product_eligible(*step, node.shape, address, device_, algorithm);
        drv::CUgraph child = capture(*node.lib, node.shape, address, capture_stream, algorithm, step);
        drv::CUresult r = drv::kCudaSuccess;
        // its weights are read before it waits for the kernel ahead
        const bool weights_ready = written_before_the_call(p_, p_.blas[static_cast<size_t>(node.lib->blas)].b);
        const bool programmatic = generated && programmatic_ && after_kernel && weights_ready;
        node.flat = (flatten_ || generated) &&
                    add_as_kernel_node(api, child, sg.graph, programmatic ? nullptr : dep, node.node);
        if (node.flat && programmatic) {
          drv::GraphEdgeData edge;
          edge.from_port = drv::kGraphKernelPortProgrammatic;
          edge.type = drv::kGraphDependencyProgrammatic;
          drv::check(api.cuGraphAddDependencies(sg.graph, &dep, &node.node, &edge, 1),
                     fmt::format("cuGraphAddDependencies(blas{} generated, programmatic)", node.lib->blas));
        }
        if (node.flat) ++flattened;
        else r = api.cuGraphAddChildGraphNode(&node.node, sg.graph, dep ? &dep : nullptr, dep ? 1 : 0, child);
        api.cuGraphDestroy(child);  // the node holds a copy
        drv::check(r, fmt::format("cuGraphAddChildGraphNode(blas{})", node.lib->blas));
        sg.nodes.push_back(std::move(node));
        continue;
      }
      // a LayerNorm whose product computes it in this bucket's graph (hopper_gemm.h: layer_norm_folded),
      // where that product then hangs on a programmatic edge from the kernel node ahead (it requests
      // its weights while that kernel finishes, as it would behind the LayerNorm kernel; behind a
      // library call's child graph it would start cold, and the LayerNorm kernel stays: measured on
      // GPT-2, docs/graphs.md)
      if (const int j = p_.steps[i].prologue_of; j >= 0 && programmatic_ && after_kernel) {
        size_t li = 0;
        while (li < library_.size() && library_[li].blas != j) ++li;
        if (li < library_.size() && library_[li].how != LibraryCapture::Plain) {
          const auto [shape, algorithm] = captured(li);
          if (algorithm != kGeneratedUnfolded && layer_norm_folded(p_.blas[static_cast<size_t>(j)], shape, address, device_, algorithm)) {
            folded[static_cast<size_t>(j)] = 1;
            continue;
          }
        }
      }
      const NodePatchPlan* n = nullptr;
      for (const NodePatchPlan& c : plan_)
        if (c.step == i) n = &c;
      const CudaKernel& k = p_.kernels[static_cast<size_t>(n->kernel)];
      node.plan = n;
      node.block.assign(std::max<size_t>(k.arg_block_bytes / 8, k.params.size()), 0);
      node.params.assign(k.params.size(), nullptr);
      sg.nodes.push_back(std::move(node));
      Bucket::Node& nd = sg.nodes.back();
      for (size_t a = 0; a < k.params.size(); ++a) nd.params[a] = &nd.block[k.params[a].offset / 8];
      auto node_address = [&](int id) { return b.node_address(address, id); };
      for (const KernelParam& a : k.params) nd.block[a.offset / 8] = param_value(a, node_address, S, sizes_address_);
      const bool aligned = use_aligned_variant(k, p_.symbols, S, node_address);
      const auto& fns = functions_[static_cast<size_t>(n->kernel)];
      nd.applied.func = aligned ? fns.first : fns.second;
      if (values.empty() && !table_.exprs.empty()) evaluate_sizes(table_, p_.symbols, S, values);
      LaunchDims d = launch_dims_of(p_, table_, dims_values(b, static_cast<size_t>(n->kernel), values), static_cast<size_t>(n->kernel), aligned);
      node_launch(b, static_cast<size_t>(n->kernel), values, aligned, node_address, nd.applied.func, d);
      // what this launch follows, so that a new size that changes none of it skips the node (run)
      if (n->fixed_arguments() && !values.empty()) nd.launch_key = launch_key(b, static_cast<size_t>(n->kernel), values);
      nd.applied.grid_x = d.grid;
      nd.applied.block_x = d.block;
      nd.applied.shared_bytes = d.shared_bytes;
      nd.applied.kernel_params = nd.params.data();
      // after another kernel node, a kernel that waits for its prior grids hangs on a programmatic edge:
      // it is scheduled while that kernel's last blocks run (runner.h: programmatic_launch)
      const Bucket::Node& prev = sg.nodes[sg.nodes.size() >= 2 ? sg.nodes.size() - 2 : 0];
      const bool programmatic = programmatic_ && k.waits_for_prior_grids && dep && sg.nodes.size() >= 2 &&
                                (!prev.lib || prev.flat);
      drv::check(api.cuGraphAddKernelNode(&nd.node, sg.graph, dep && !programmatic ? &dep : nullptr,
                                          dep && !programmatic ? 1 : 0, &nd.applied),
                 fmt::format("cuGraphAddKernelNode({})", k.name));
      if (programmatic) {
        drv::GraphEdgeData edge;
        edge.from_port = drv::kGraphKernelPortProgrammatic;
        edge.type = drv::kGraphDependencyProgrammatic;
        drv::check(api.cuGraphAddDependencies(sg.graph, &dep, &nd.node, &edge, 1),
                   fmt::format("cuGraphAddDependencies({}, programmatic)", k.name));
      }
    }
    drv::check(api.cuGraphInstantiateWithFlags(&sg.exec, sg.graph, 0), "cuGraphInstantiateWithFlags");
    // The first launch of an instantiated graph uploads it to the device: measured on an H100, 93-114 us
    // in the one cuGraphLaunch of GPT-2's first replay after a bucket was recorded, against 4-8 us for
    // later ones (docs/graphs.md). Uploaded here, on the recording's stream (the compile worker's when
    // recording in the background), so that no call pays it.
    // With PROTEAN_CUDA_GRAPH_UPLOAD=launch, on the stream the calls launch it on instead (the device's):
    // queued behind the plain launches of calls in flight, and ahead of the graph's first launch there;
    // with =off, not at all (the first launch uploads it). A bucket without library calls captured
    // nothing, so its recording's stream may not exist yet: it is made here, rather than uploading to
    // (and synchronizing) the legacy default stream.
    if (upload && !upload_on_launch_stream_) make_capture_stream(api, capture_stream);
    if (upload) drv::check(api.cuGraphUpload(sg.exec, upload_on_launch_stream_ ? drv::stream(device_) : capture_stream), "cuGraphUpload");
  }
  if (upload && !upload_on_launch_stream_ && api.cuStreamSynchronize)  // the uploads done before a call may launch the graphs
    drv::check(api.cuStreamSynchronize(capture_stream), "cuStreamSynchronize(after cuGraphUpload)");
  b.recorded = true;
  count_graph_recording(1);
  if (observe::log_enabled(observe::LogCat::Graphs))
    observe::log_line(observe::LogCat::Graphs, in_.compile_id,
                      fmt::format("recorded {} graph segment(s) of '{}' for bucket {}{} in {:.1f} us ({} library call(s) "
                                  "as kernel nodes, {} LayerNorm kernel(s) folded into their products)",
                                  b.segments.size(), p_.name, b.index, background_ ? " on the compile worker" : "",
                                  std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count(),
                                  flattened, std::count(folded.begin(), folded.end(), 1)));
}

namespace {

/// How max-autotune times its candidates (PROTEAN_AUTOTUNE_TIMING; docs/graphs.md):
///   graph (default)  each candidate launched back to back inside one captured CUDA graph, a cuBLASLt
///                    candidate's weights rotating over copies that together exceed the L2 cache;
///   cold             stream launches: a cuBLASLt candidate alone after an L2 flush, row kernels 10
///                    back-to-back stream launches;
///   hot              stream launches back to back, the cuBLASLt candidates on cached weights too.
/// Another value warns once and is the default.
enum class TuneTiming { Graph, Cold, Hot };
TuneTiming autotune_timing() {
  const char* e = std::getenv("PROTEAN_AUTOTUNE_TIMING");
  const std::string v = e ? e : "";
  if (v.empty() || v == "graph") return TuneTiming::Graph;
  if (v == "cold") return TuneTiming::Cold;
  if (v == "hot") return TuneTiming::Hot;
  static std::once_flag once;
  std::call_once(once, [&] {
    observe::warn(fmt::format("PROTEAN_AUTOTUNE_TIMING='{}' is not one of graph, cold, hot; using graph", v));
  });
  return TuneTiming::Graph;
}
/// The tuning table key's part that names the timing (tables timed another way are not reused).
const char* timing_tag(TuneTiming t) { return t == TuneTiming::Graph ? "|in-graph" : t == TuneTiming::Cold ? "|cold-l2" : ""; }

// A row kernel whose block is sized at launch (its code strides by blockDim.x, its row in registers).
bool threads_tunable(const LaunchRule& r) {
  return r.shape == LaunchShape::BlockPerRow && r.block_from_row && r.row_length && r.row_capacity > 0 &&
         r.block_threads > 32;
}

}  // namespace

void GraphRunner::apply_tuning(const Bucket& b, size_t k, const LaunchRule& rule, LaunchDims& d) const {
  if (k >= b.threads.size() || !b.threads[k] || !threads_tunable(rule)) return;
  const uint32_t t = b.threads[k];
  if (t > d.block && t <= static_cast<uint32_t>(rule.block_threads)) d.block = t;
}

std::span<const int64_t> GraphRunner::dims_values(const Bucket& b, size_t k, std::span<const int64_t> values) const {
  return k < b.at_bound.size() && b.at_bound[k] ? std::span<const int64_t>(b.upper_values) : values;
}

NodeLaunchKey GraphRunner::launch_key(const Bucket& b, size_t k, std::span<const int64_t> values) const {
  return node_launch_key(p_, table_, values, dims_values(b, k, values), k, k < b.variant.size() ? b.variant[k] : 0);
}

void GraphRunner::node_launch(const Bucket& b, size_t k, std::span<const int64_t> values, bool aligned,
                              const std::function<uint64_t(int)>& address, drv::CUfunction& fn, LaunchDims& d) const {
  const CudaKernel& kern = p_.kernels[k];
  const LaunchRule* rule = aligned ? &kern.aligned.launch : &kern.general.launch;
  const bool only_entry = kern.aligned.entry == kern.general.entry;
  if (k < b.variant.size() && b.variant[k] > 0 && (aligned || only_entry)) {
    const size_t v = static_cast<size_t>(b.variant[k] - 1);
    bool ok = sizes_allow_tune_variant(p_, table_, values, k, v);
    for (int id : kern.tune[v].rule.aligned_buffers) ok = ok && address(id) % 16 == 0;
    if (ok) {
      fn = b.variant_fn[k];
      d = tune_launch_dims_of(p_, table_, dims_values(b, k, values), k, v);
      rule = &kern.tune[v].variant.launch;
    }
  }
  apply_tuning(b, k, *rule, d);
}

bool GraphRunner::load_tune_variants(double& compile_ms, std::string& how) {
  if (tune_state_ == 1) return true;
  if (tune_state_ == 2) return false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const drv::DriverApi& api = drv::require_driver("max-autotune");
    std::shared_ptr<const std::vector<uint8_t>> cubin;
    if (!p_.tune_cubin.empty()) {
      cubin = std::make_shared<const std::vector<uint8_t>>(p_.tune_cubin);
      how = "compiled with the program";
    } else {
      if (p_.tune_source.empty()) throw CompileError("the program has no tune variants' source");
      const drv::DeviceInfo& dev = drv::device_info(device_);
      NvrtcOptions o;
      o.arch = fmt::format("sm_{}{}", dev.cc_major, dev.cc_minor);
      const CubinKey key = cubin_key(p_.tune_source, o);  // as the program's cubin, over the variants' unit
      bool built = false;
      cubin = cache::get_or_build_blob("cubins", key.combined(), p_.tune_source,
                                       fmt::format("nvrtc {} {} {} (max-autotune variants of '{}')", key.nvrtc_version,
                                                   key.arch, key.flags, p_.name),
                                       [&] {
                                         built = true;
                                         return nvrtc_compile_parts(p_.tune_source, p_.name + "_tune.cu", o, nvrtc_default_jobs()).cubin;
                                       });
      how = built ? "compiled by NVRTC" : "from the artifact cache";
      tune_nvrtc_ = built;
    }
    tune_modules_.load(api, *cubin, fmt::format("max-autotune variants of '{}'", p_.name));
    tune_fns_.assign(p_.kernels.size(), {});
    const bool clusters = drv::device_info(device_).cc_major >= 9;  // thread-block clusters: sm_90+
    for (size_t k = 0; k < p_.kernels.size(); ++k)
      for (const TuneVariant& v : p_.kernels[k].tune) {
        if (v.split > 1 && !clusters) {  // a split variant never runs here (its entry traps below sm_90)
          tune_fns_[k].push_back(nullptr);
          continue;
        }
        drv::CUfunction fn = tune_modules_.function(api, v.variant.entry);
        if (v.variant.launch.shared_bytes > 48 * 1024)
          drv::check(api.cuFuncSetAttribute(fn, drv::kFuncAttrMaxDynamicSharedBytes, static_cast<int>(v.variant.launch.shared_bytes)),
                     fmt::format("cuFuncSetAttribute({})", v.variant.entry));
        if (v.split > 1) {  // the cluster its launch rule counts on is the one the entry declares
          int width = 0;
          drv::check(api.cuFuncGetAttribute(&width, drv::kFuncAttrRequiredClusterWidth, fn),
                     fmt::format("cuFuncGetAttribute({}, cluster width)", v.variant.entry));
          if (width != v.variant.launch.cluster) {
            observe::warn(fmt::format("max-autotune of '{}': entry {} declares clusters of {} blocks, its launch rule {}; "
                                      "it is never launched",
                                      p_.name, v.variant.entry, width, v.variant.launch.cluster));
            fn = nullptr;
          }
        }
        tune_fns_[k].push_back(fn);
      }
    tune_state_ = 1;
  } catch (const Error& e) {
    tune_state_ = 2;
    how = "failed";
    observe::warn(fmt::format("max-autotune of '{}': the row kernels' variants could not be loaded ({}); their sites keep "
                              "the untuned kernels",
                              p_.name, e.what()));
  }
  compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return tune_state_ == 1;
}

void GraphRunner::tune(Bucket& b, const std::function<uint64_t(int)>& address, drv::CUstream& stream) {
  b.tuned = true;
  b.lib_algo.assign(library_.size(), -1);
  b.threads.assign(p_.kernels.size(), 0);
  b.variant.assign(p_.kernels.size(), 0);
  b.variant_fn.assign(p_.kernels.size(), nullptr);
  const drv::DriverApi& api = drv::require_driver("max-autotune");
  const AutotuneTimer test_timer = autotune_timer_for_testing();
  const double budget_ms = autotune_budget_ms();
  TuningTable& table = process_tuning_table();
  const std::string device = drv::device_info(device_).name;
  // The table's bucket part is what the sites are timed at, the bucket's upper bounds, not its range:
  // a range's lower end follows the symbol's known range (none in a cold run, the PGO profile's
  // observed range in a warm one), so keying by the range missed the lowest bucket of every warm run.
  std::string bucket, range;
  for (size_t i = 0; i < b.key.size(); ++i) {
    bucket += fmt::format("{}{} at {}", i ? ", " : "", sym::print(p_.symbols[i]), i < b.upper.size() ? b.upper[i] : b.key[i].hi);
    range += fmt::format("{}{} in {}", i ? ", " : "", sym::print(p_.symbols[i]), b.key[i].str());
  }
  const uint64_t source_hash = p_.key.source_hash ? p_.key.source_hash : XXH64(p_.source.data(), p_.source.size(), 0);
  AutotuneStats st;
  st.buckets_tuned = 1;
  wait_for_blas_prewarm();  // the cuBLASLt warm-up's time is not the tuning budget's
  const auto t0 = std::chrono::steady_clock::now();
  double compile_ms = 0;  // loading the row kernels' variants: reported, not the budget's
  auto spent_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() - compile_ms;
  };

  // Scratch memory for timing on the device: the arena's layout and every input and output at the
  // upper bounds, never the bucket's arena (a replay of another bucket, or plain calls, may run meanwhile).
  // cuBLASLt candidates get their own workspace at the end of it (the device's is shared with calls).
  std::shared_ptr<Storage> scratch;
  std::vector<uint64_t> scratch_addr;
  uint64_t workspace = 0, scratch_sizes = 0;
  auto scratch_address = [&](int id) -> uint64_t {
    if (!scratch) {
      int64_t at = align_up(std::max<int64_t>(b.layout.bytes, 1), kBufferAlignment);
      std::vector<int64_t> off(p_.buffers.buffers.size(), -1);
      for (const PlannedBuffer& pb : p_.buffers.buffers) {
        if (b.layout.offset[static_cast<size_t>(pb.id)] >= 0 || pb.kind == loop::BufferKind::Constant) continue;
        off[static_cast<size_t>(pb.id)] = at;
        at = align_up(at + std::max<int64_t>(eval_size(pb.bytes, p_.symbols, b.upper), 1), kBufferAlignment);
      }
      const int64_t ws_at = at;
      at += static_cast<int64_t>(kBlasWorkspaceBytes);
      const int64_t sizes_at = at;  // the upper bounds, for kernels that read their sizes from memory
      at += 8 * static_cast<int64_t>(std::max<size_t>(b.upper.size(), 1));
      scratch = std::make_shared<Storage>(static_cast<size_t>(at), Device{DeviceType::CUDA, device_});
      // The block is ordered on the device's stream (cuMemAllocAsync): wait for it there before the
      // tuning stream uses it.
      drv::check(api.cuStreamSynchronize(drv::stream(device_)), "cuStreamSynchronize(before tuning)");
      const uint64_t base = reinterpret_cast<uint64_t>(scratch->data());
      workspace = base + static_cast<uint64_t>(ws_at);
      scratch_sizes = base + static_cast<uint64_t>(sizes_at);
      if (!b.upper.empty()) drv::copy_host_to_device(device_, scratch_sizes, b.upper.data(), 8 * b.upper.size());
      scratch_addr.assign(p_.buffers.buffers.size(), 0);
      for (const PlannedBuffer& pb : p_.buffers.buffers) {
        const size_t i = static_cast<size_t>(pb.id);
        if (b.layout.offset[i] >= 0) scratch_addr[i] = base + static_cast<uint64_t>(b.layout.offset[i]);
        else if (off[i] >= 0) scratch_addr[i] = base + static_cast<uint64_t>(off[i]);
        else scratch_addr[i] = address(pb.id);  // constants: read only
      }
    }
    return scratch_addr[static_cast<size_t>(id)];
  };
  drv::CUevent ev0 = nullptr, ev1 = nullptr;
  struct Events {
    const drv::DriverApi& api;
    drv::CUevent& a;
    drv::CUevent& b;
    ~Events() {
      if (a) api.cuEventDestroy(a);
      if (b) api.cuEventDestroy(b);
    }
  } events{api, ev0, ev1};
  // The tuning stream and its two events, made on first use.
  auto prepare_timing = [&] {
    if (!stream) drv::check(api.cuStreamCreate(&stream, drv::kStreamNonBlocking), "cuStreamCreate(tuning stream)");
    if (!ev0) drv::check(api.cuEventCreate(&ev0, 0), "cuEventCreate");
    if (!ev1) drv::check(api.cuEventCreate(&ev1, 0), "cuEventCreate");
  };
  // Microseconds the device spends on what `enqueue` queues on the tuning stream (between two events).
  auto elapsed_us = [&](const std::function<void()>& enqueue) -> double {
    prepare_timing();
    drv::check(api.cuEventRecord(ev0, stream), "cuEventRecord");
    enqueue();
    drv::check(api.cuEventRecord(ev1, stream), "cuEventRecord");
    drv::check(api.cuEventSynchronize(ev1), "cuEventSynchronize");
    float ms = 0;
    drv::check(api.cuEventElapsedTime(&ms, ev0, ev1), "cuEventElapsedTime");
    return 1e3 * ms;
  };
  auto median = [](std::vector<double> us) {
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  // Microseconds per call of `launch` on the tuning stream: 2 warm-up calls, then 10 between events.
  auto time_on_device = [&](const std::function<void()>& launch) -> double {
    constexpr int kCalls = 10;
    prepare_timing();
    for (int i = 0; i < 2; ++i) launch();
    return elapsed_us([&] {
             for (int i = 0; i < kCalls; ++i) launch();
           }) /
           kCalls;
  };
  const TuneTiming timing = autotune_timing();
  // Microseconds per launch as the bucket's graph meets it: `reps` calls of `launch(r)` captured into
  // one CUDA graph on the tuning stream (no host launch gap between them: a back-to-back stream launch
  // of a 3 us row kernel measures the host's launch rate, not the kernel), the graph uploaded and
  // launched once, then launched 5 times between two events; the median launch divided by `reps`.
  auto time_in_graph = [&](int reps, const std::function<void(int)>& launch) -> double {
    prepare_timing();
    prepare_blas_device(device_);  // cuBLASLt's handle: no allocation inside the capture
    struct Graph {
      const drv::DriverApi& api;
      drv::CUgraph g = nullptr;
      drv::CUgraphExec exec = nullptr;
      ~Graph() {
        if (exec) api.cuGraphExecDestroy(exec);
        if (g) api.cuGraphDestroy(g);
      }
    } graph{api};
    drv::check(api.cuStreamBeginCapture(stream, drv::kStreamCaptureModeThreadLocal), "cuStreamBeginCapture(tuning)");
    try {
      for (int r = 0; r < reps; ++r) launch(r);
    } catch (...) {
      if (api.cuStreamEndCapture(stream, &graph.g) != drv::kCudaSuccess) graph.g = nullptr;
      throw;
    }
    drv::check(api.cuStreamEndCapture(stream, &graph.g), "cuStreamEndCapture(tuning)");
    drv::check(api.cuGraphInstantiateWithFlags(&graph.exec, graph.g, 0), "cuGraphInstantiateWithFlags(tuning)");
    if (api.cuGraphUpload) drv::check(api.cuGraphUpload(graph.exec, stream), "cuGraphUpload(tuning)");
    drv::check(api.cuGraphLaunch(graph.exec, stream), "cuGraphLaunch(tuning)");
    std::vector<double> us;
    for (int i = 0; i < 5; ++i)
      us.push_back(elapsed_us([&] { drv::check(api.cuGraphLaunch(graph.exec, stream), "cuGraphLaunch(tuning)"); }) / reps);
    return median(std::move(us));
  };
  // A row kernel's candidate: 20 launches in a graph, or (timing cold / hot) 10 stream launches.
  auto time_row_kernel = [&](const std::function<void()>& launch) -> double {
    if (timing == TuneTiming::Graph) return time_in_graph(20, [&](int) { launch(); });
    return time_on_device(launch);
  };
  // A cuBLASLt candidate as the graph meets it: its weights stream from device memory (a model's
  // weights do not fit the L2 cache, and each product reads its own), not from the L2 lines that
  // back-to-back repeats of one product leave, while its activations come from the L2 (the kernel
  // before it wrote them). Timing graph: the candidate launched back to back in a graph, its weight
  // operand (one the call does not write: written_before_the_call) rotating over copies in a pool of
  // twice the L2 cache's bytes, so no launch finds its weights cached. Timing cold: each timed call
  // follows a write of the whole pool on the tuning stream and is timed alone between two events, the
  // median of 10 (Triton's do_bench clears the cache the same way). Timing hot: back to back on cached
  // weights.
  std::shared_ptr<Storage> flush;
  size_t flush_bytes = 0;
  auto flush_pool = [&]() -> drv::CUdeviceptr {
    if (!flush) {
      const int l2 = drv::device_info(device_).l2_bytes;
      flush_bytes = 2 * static_cast<size_t>(l2 > 0 ? l2 : 64 << 20);
      flush = std::make_shared<Storage>(flush_bytes, Device{DeviceType::CUDA, device_});
      drv::check(api.cuStreamSynchronize(drv::stream(device_)), "cuStreamSynchronize(before tuning)");
      // defined contents for the weight copies (their values do not change a product's time)
      drv::check(api.cuMemsetD8Async(reinterpret_cast<drv::CUdeviceptr>(flush->data()), 0, flush_bytes, drv::stream(device_)),
                 "cuMemsetD8Async(tuning pool)");
      drv::check(api.cuStreamSynchronize(drv::stream(device_)), "cuStreamSynchronize(tuning pool)");
    }
    return reinterpret_cast<drv::CUdeviceptr>(flush->data());
  };
  // `launch(address)`: the candidate on the operands `address` gives; `weights`: the weight operand's
  // buffer id and bytes (id -1: an operand the program writes, which stays where it is).
  auto time_product = [&](const std::function<void(const std::function<uint64_t(int)>&)>& launch, int weight_id,
                          int64_t weight_bytes) -> double {
    const std::function<uint64_t(int)> at = scratch_address;
    if (timing == TuneTiming::Hot) return time_on_device([&] { launch(at); });
    if (timing == TuneTiming::Graph) {
      const drv::CUdeviceptr pool = flush_pool();
      const size_t slice = static_cast<size_t>(align_up(std::max<int64_t>(weight_bytes, 1), kBufferAlignment));
      const int copies = weight_id < 0 || slice > flush_bytes ? 1 : static_cast<int>(std::min<size_t>(64, flush_bytes / slice));
      const int reps = copies > 1 ? std::max(copies, 8) : 20;
      return time_in_graph(reps, [&](int r) {
        if (copies == 1) return launch(at);
        const uint64_t w = pool + static_cast<uint64_t>(r % copies) * slice;
        launch([&](int id) { return id == weight_id ? w : at(id); });
      });
    }
    prepare_timing();
    const drv::CUdeviceptr f = flush_pool();
    for (int i = 0; i < 2; ++i) launch(at);
    std::vector<double> us;
    for (int i = 0; i < 10; ++i) {
      drv::check(api.cuMemsetD8Async(f, static_cast<unsigned char>(i), flush_bytes, stream), "cuMemsetD8Async(L2 flush)");
      us.push_back(elapsed_us([&] { launch(at); }));
    }
    return median(std::move(us));
  };
  std::string changed;
  // One site: its winner from the table, else timed (within the budget) and stored.
  // `runs(i)` false: candidate i cannot run on this device or at these sizes (it is not timed and never wins).
  auto site = [&](const std::string& key, const std::function<std::string(int)>& what, int candidates,
                  const std::function<double(int)>& time, const std::function<bool(int)>& runs = {}) -> int {
    if (candidates < 2) return 0;
    if (std::optional<TuneEntry> e = table.find(key); e && e->choice < candidates) {
      ++st.sites_from_table;
      if (e->choice != 0)  // a winner an earlier run chose: the log names it as a timed one would be
        changed += fmt::format("{}{} (from the table)", changed.empty() ? "" : ", ", what(e->choice));
      return e->choice;
    }
    if (spent_ms() > budget_ms) {
      ++st.sites_over_budget;
      return 0;
    }
    std::vector<double> us(static_cast<size_t>(candidates), -1.0);
    for (int i = 0; i < candidates; ++i) {
      if (runs && !runs(i)) continue;
      try {
        us[static_cast<size_t>(i)] = test_timer ? test_timer(key, i) : time(i);
      } catch (const Error&) {  // a candidate that cannot run at this shape never wins
        us[static_cast<size_t>(i)] = -1.0;
      }
      ++st.candidates_timed;
    }
    const int w = pick_winner(us);
    ++st.sites_tuned;
    table.put(key, TuneEntry{w, candidates, us[0], us[static_cast<size_t>(w)]});
    if (w != 0) {
      ++st.sites_changed;
      changed += fmt::format("{}{} ({:.1f} -> {:.1f} us)", changed.empty() ? "" : ", ", what(w), us[0], us[static_cast<size_t>(w)]);
    }
    return w;
  };

  // The sizes at the upper bounds are this thread's own (calls may evaluate theirs meanwhile).
  std::vector<int64_t> upv;
  evaluate_sizes(table_, p_.symbols, b.upper, upv);
  // Kernel k's argument block at the upper bounds on the scratch memory, and cuLaunchKernel's pointers.
  auto arg_block = [&](const CudaKernel& k, std::vector<uint64_t>& block, std::vector<void*>& params) {
    block.assign(std::max<size_t>(k.arg_block_bytes / 8, k.params.size()), 0);
    params.assign(k.params.size(), nullptr);
    for (size_t a = 0; a < k.params.size(); ++a) {
      const KernelParam& kp = k.params[a];
      if (kp.kind == ParamKind::Sizes) (void)scratch_address(0);  // the scratch block holds the sizes
      block[kp.offset / 8] = param_value(kp, scratch_address, b.upper, scratch_sizes);
      params[a] = &block[kp.offset / 8];
    }
  };
  // Products captured padded: the heuristic's algorithms at the padded shape. Where the untuned plan
  // runs the product as a generated product (hopper_gemm.h), it keeps it (autotune_generated_products),
  // or, when those are timed, that is candidate 0 and cuBLASLt's algorithms are 1..n: an explicit
  // algorithm turns the generated product off, so it must beat it.
  const int algos = autotune_blas_algorithms(), one_kernel = autotune_blas_one_kernel();
  for (size_t li = 0; li < library_.size(); ++li) {
    const LibraryNodePlan& n = library_[li];
    if (n.how != LibraryCapture::Padded) continue;
    const BlasStep& bs = p_.blas[static_cast<size_t>(n.blas)];
    const BlasShape& shape = b.padded[li];
    const std::function<uint64_t(int)> at = scratch_address;
    const bool generated = generated_product_eligible(bs, shape, at, device_);
    if (generated && !autotune_generated_products()) continue;  // it keeps the generated product
    // A LayerNorm the generated product computes (layer_norm_folded): each cuBLASLt candidate runs
    // after the LayerNorm's kernel, as the graph would run them, and is timed with it.
    const bool folds = generated && bs.has_prologue();
    std::vector<uint64_t> ln_block;
    std::vector<void*> ln_params;
    drv::CUfunction ln_fn = nullptr;
    LaunchDims ln_d;
    if (folds) {
      const size_t lk = static_cast<size_t>(p_.steps[static_cast<size_t>(bs.prologue.kernel_step)].index);
      const bool al = sizes_allow_aligned(p_, table_, upv, lk);
      ln_fn = al ? functions_[lk].first : functions_[lk].second;
      ln_d = launch_dims_of(p_, table_, upv, lk, al);
      arg_block(p_.kernels[lk], ln_block, ln_params);
    }
    const std::string sig = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}x{}x{}x{}|{}|{}", short_name(bs.dtype), bs.transpose_b,
                                        bs.epilogue.bias >= 0, static_cast<int>(bs.epilogue.gelu), bs.epilogue.residual >= 0,
                                        bs.epilogue.alpha, bs.epilogue.beta, static_cast<int>(bs.op), shape.batch, shape.m,
                                        shape.n, shape.k, shape.stride_a, shape.stride_b) +
                            timing_tag(timing) + (generated ? generated_tag(bs, shape) : std::string()) + (folds ? "|layer_norm folded, unfolded" : "") +
                            fmt::format("|algos {} one-kernel {}", algos, one_kernel);
    const std::string key = TuningTable::key(device, "blas", XXH64(sig.data(), sig.size(), 0), bucket);
    // candidates: the generated product (with its LayerNorm folded in, then also behind the LayerNorm's
    // kernel), then cuBLASLt's algorithms
    const int first = folds ? 2 : generated ? 1 : 0;  // candidate of cuBLASLt's algorithm 0
    const BlasStep unfolded = folds ? prologue_off(bs) : BlasStep{};
    // cuBLASLt's candidates as run_blas_at's algorithm values
    const std::vector<int> lib = blas_tune_algorithms(bs, shape, device_, algos, one_kernel);
    const int candidates = first + static_cast<int>(lib.size());
    // the weight operand rotates over copies when the call does not write it (a program's weights)
    const int weight_id = written_before_the_call(p_, bs.b) ? bs.b : -1;
    const int64_t weight_bytes =
        weight_id >= 0 ? eval_size(p_.buffers.buffers[static_cast<size_t>(weight_id)].bytes, p_.symbols, b.upper) : 0;
    auto what = [&](int i) {
      if (folds && i < first) return fmt::format("blas{} generated product{}", n.blas, i == 0 ? " (LayerNorm folded in)" : "");
      return i < first ? fmt::format("blas{} generated product", n.blas)
                       : fmt::format("blas{} algorithm {}", n.blas, lib[static_cast<size_t>(i - first)]);
    };
    const int w = site(key, what, candidates, [&](int i) {
      scratch_address(bs.out);  // the scratch block, and with it `workspace`, exists from here
      const int algorithm = i < first ? -1 : lib[static_cast<size_t>(i - first)];
      // The generated product as the bucket's graph launches it: with programmatic stream
      // serialization where the call does not write its weights (it requests them while the kernel
      // before it finishes), which a timing of plain launches would not credit it with.
      const bool programmatic = i < first && programmatic_ && timing == TuneTiming::Graph && weight_id >= 0;
      const BlasStep& step = folds && i == 1 ? unfolded : bs;
      return time_product([&](const std::function<uint64_t(int)>& addr) {
        if (folds && i >= 1 && ln_d.grid > 0)
          drv::check(api.cuLaunchKernel(ln_fn, ln_d.grid, 1, 1, ln_d.block, 1, 1, ln_d.shared_bytes, stream, ln_params.data(), nullptr),
                     fmt::format("cuLaunchKernel(the LayerNorm before blas{})", n.blas));
        if (programmatic) run_generated_product(step, shape, addr, device_, stream, true);
        else run_blas_at(step, shape, addr, device_, stream, algorithm, workspace);
      }, folds && i == 0 && weight_id >= 0 ? bs.prologue.weight : weight_id, weight_bytes);
    });
    // 0: the untuned choice (the generated product, or cuBLASLt's heuristic first)
    b.lib_algo[li] = w == 0 ? -1 : folds && w == 1 ? kGeneratedUnfolded : lib[static_cast<size_t>(w - first)];
  }
  // Row kernels.
  const uint64_t tune_hash = XXH64(p_.tune_source.data(), p_.tune_source.size(), 0);
  std::string variants_how;
  for (const NodePatchPlan& n : plan_) {
    const size_t ki = static_cast<size_t>(n.kernel);
    const CudaKernel& k = p_.kernels[ki];
    const bool aligned = sizes_allow_aligned(p_, table_, upv, ki);
    const auto& fns = functions_[ki];
    // Compiled-in parameters (rows per block, vector width): candidate 0 the kernel's own entry, then
    // its variants, each at its own launch. Only where the variants apply at the bound: the aligned
    // path, or a kernel with one entry.
    if (!k.tune.empty() && (aligned || k.aligned.entry == k.general.entry)) {
      // the key names the candidates (their order is the choice's meaning) and the variants' text
      std::string sig = fmt::format("{:016x}|{:016x}|{}|own", source_hash, tune_hash, k.aligned.entry);
      for (const TuneVariant& v : k.tune) sig += " " + v.tag();
      const std::string key = TuningTable::key(device, "variant", XXH64(sig.data(), sig.size(), 0), bucket);
      const int candidates = 1 + static_cast<int>(k.tune.size());
      const std::optional<TuneEntry> known = table.find(key);
      // the variants' module is needed unless the table says the kernel's own entry won
      const bool need = !known || known->choice >= candidates || known->choice != 0;
      if (!need || load_tune_variants(compile_ms, variants_how)) {
        auto what = [&](int i) { return fmt::format("{} {}", k.name, i ? k.tune[static_cast<size_t>(i - 1)].tag() : "own"); };
        const int w = site(key, what, candidates, [&](int i) -> double {
          drv::CUfunction fn = aligned ? fns.first : fns.second;
          LaunchDims d = launch_dims_of(p_, table_, upv, ki, aligned);
          if (i > 0) {
            const size_t v = static_cast<size_t>(i - 1);
            if (!sizes_allow_tune_variant(p_, table_, upv, ki, v)) return -1.0;  // cannot run at the bound
            fn = tune_fns_[ki][v];
            d = tune_launch_dims_of(p_, table_, upv, ki, v);
          }
          if (d.grid == 0) return -1.0;
          std::vector<uint64_t> block;
          std::vector<void*> params;
          arg_block(k, block, params);
          return time_row_kernel([&] {
            drv::check(api.cuLaunchKernel(fn, d.grid, 1, 1, d.block, 1, 1, d.shared_bytes, stream, params.data(), nullptr),
                       fmt::format("cuLaunchKernel({}, candidate {})", k.name, what(i)));
          });
        }, [&](int i) {
          if (i == 0) return true;
          const size_t v = static_cast<size_t>(i - 1);
          if (!tune_fns_[ki][v]) return false;  // not on this device (a split below sm_90)
          if (k.tune[v].split <= 1) return true;
          // a split row: only where the rows at the bound leave multiprocessors idle
          try {
            const LaunchDims d = tune_launch_dims_of(p_, table_, upv, ki, v);
            return d.grid / std::max(d.cluster, 1u) < static_cast<uint32_t>(std::max(drv::device_info(device_).sm_count, 1));
          } catch (const Error&) {  // cannot launch at the bound
            return false;
          }
        });
        if (w > 0 && tune_state_ == 1 && tune_fns_[ki][static_cast<size_t>(w - 1)]) {
          b.variant[ki] = w;
          b.variant_fn[ki] = tune_fns_[ki][static_cast<size_t>(w - 1)];
        }
      }
    }
    // Threads per row, where the block is sized at launch: from the rule's choice up by powers of two,
    // for the entry the bucket launches (its own or the winning variant).
    const TuneVariant* tv = b.variant[ki] > 0 ? &k.tune[static_cast<size_t>(b.variant[ki] - 1)] : nullptr;
    const LaunchRule& rule = tv ? tv->variant.launch : aligned ? k.aligned.launch : k.general.launch;
    if (!threads_tunable(rule) || b.threads[ki]) continue;
    const LaunchDims d0 = tv ? tune_launch_dims_of(p_, table_, upv, ki, static_cast<size_t>(b.variant[ki] - 1))
                             : launch_dims_of(p_, table_, upv, ki, aligned);
    std::vector<uint32_t> threads;
    for (uint32_t t = d0.block; t <= static_cast<uint32_t>(rule.block_threads); t *= 2) threads.push_back(t);
    if (threads.size() < 2 || d0.grid == 0) continue;
    // the kernel's own entry keeps the key it had before variants existed
    const std::string sig = fmt::format("{:016x}|{}", source_hash, tv ? tv->variant.entry : (aligned ? k.aligned : k.general).entry);
    const std::string key = TuningTable::key(device, "threads", XXH64(sig.data(), sig.size(), 0), bucket);
    auto what = [&](int i) { return fmt::format("{} {} threads per row", k.name, threads[static_cast<size_t>(i)]); };
    const int w = site(key, what, static_cast<int>(threads.size()), [&](int i) {
      std::vector<uint64_t> block;
      std::vector<void*> params;
      arg_block(k, block, params);
      const drv::CUfunction fn = tv ? b.variant_fn[ki] : aligned ? fns.first : fns.second;
      const uint32_t t = threads[static_cast<size_t>(i)];
      return time_row_kernel([&] {
        drv::check(api.cuLaunchKernel(fn, d0.grid, 1, 1, t, 1, 1, d0.shared_bytes, stream, params.data(), nullptr),
                   fmt::format("cuLaunchKernel({}, {} threads)", k.name, t));
      });
    });
    if (w) b.threads[ki] = threads[static_cast<size_t>(w)];
  }
  if (!variants_how.empty() && tune_state_ == 1) {  // loaded while tuning this bucket
    std::set<std::string> kernels;
    for (const CudaKernel& k : p_.kernels)
      if (!k.tune.empty() && kernels.insert(k.aligned.entry).second) st.variant_entries += static_cast<int64_t>(k.tune.size());
    st.variant_kernels = static_cast<int64_t>(kernels.size());
    st.variant_nvrtc = tune_nvrtc_ ? 1 : 0;
  }
  st.variant_compile_ms = compile_ms;
  st.tuning_ms = spent_ms();
  count_autotune(st);
  std::string variants_line;  // the variants' load, in the bucket that did it
  if (!variants_how.empty())
    variants_line = tune_state_ == 1 ? fmt::format("{} row-kernel variant(s) of {} kernel(s) {} in {:.1f} ms", st.variant_entries,
                                                   st.variant_kernels, variants_how, compile_ms)
                                     : fmt::format("row-kernel variants not loaded ({:.1f} ms)", compile_ms);
  if (st.sites_tuned) table.save(tuning_path());
  if (observe::log_enabled(observe::LogCat::Graphs))
    observe::log_line(observe::LogCat::Graphs, in_.compile_id,
                      fmt::format("max-autotune: bucket {} of '{}' ({}) at its upper bounds: {} site(s) timed ({} "
                                  "candidates) in {:.1f} ms of a {:.0f} ms budget, {} from the tuning table, {} over "
                                  "budget; {}",
                                  b.index, p_.name, range, st.sites_tuned, st.candidates_timed, st.tuning_ms, budget_ms,
                                  st.sites_from_table, st.sites_over_budget,
                                  (variants_line.empty() ? "" : variants_line + "; ") +
                                      (changed.empty() ? "every default kept" : "changed: " + changed)));
}

void GraphRunner::run(std::span<const int64_t> S, const std::function<uint64_t(int)>& address,
                      const std::function<void(const Step&)>& run_step) {
  Bucket& b = *current_;
  const drv::DriverApi& api = drv::require_driver("cuda graphs");
  const drv::CUstream stream = drv::stream(device_);
  const bool same_sizes = b.last_sizes.size() == S.size() && std::equal(S.begin(), S.end(), b.last_sizes.begin());

  int64_t patches = 0, recomputed = 0;  // kernel nodes whose launch was computed again, and patched
  const bool size_change = b.recorded && !same_sizes;
  using Clock = std::chrono::steady_clock;
  auto ns_since = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
  };
  int64_t patch_ns = 0, driver_ns = 0, launch_ns = 0;  // size changes: where the host time goes
  int64_t first_launch_ns = -1, first_patches = 0;     // until the first chunk's launch returned
  // size changes, with the graphs log on: the kernels whose nodes changed (named in its line)
  const bool log_patched = size_change && observe::log_enabled(observe::LogCat::Graphs);
  std::vector<std::string_view> patched;
  bool just_recorded = false;
  if (!b.recorded) {
    record(b, S, address, capture_stream_);
    just_recorded = true;
  } else if (!same_sizes) {
    // A new shape of an exact library node: the bucket's graph is recorded again. Replacing the child
    // graph in place (cuGraphExecChildGraphNodeSetParams) is not used: on the H200 the driver refused
    // it at every new length of a test block, and on GPT-2, where it was accepted, the output was
    // wrong at two lengths of four (relative L2 0.36-0.40 against PyTorch; cause not found).
    const std::span<const int64_t> v = size_values(S);
    bool rerecord = false;
    if (has_exact_)  // else no node to look at (and none of their memory to touch before the first launch)
      for (const Bucket::Segment& sg : b.segments)
        for (const Bucket::Node& nd : sg.nodes)
          if (!rerecord && nd.lib && nd.lib->how == LibraryCapture::Exact &&
              blas_shape_of(table_, v, static_cast<size_t>(nd.lib->blas)) != nd.shape) {
            hint(fmt::format("blas{}: a new shape inside the bucket: the bucket's graph is recorded again", nd.lib->blas));
            rerecord = true;
          }
    if (rerecord) {
      destroy_graphs(b);
      record(b, S, address, capture_stream_);
      just_recorded = true;
    }
  }
  // Patches a segment's kernel nodes whose launch changed (exact sizes, this call's input and output
  // addresses). Padded library nodes never change in a bucket (arena and constant operands, the padded
  // shape); exact ones were dealt with above.
  std::vector<uint64_t>& scratch = scratch_;
  const std::function<uint64_t(int)> node_address = [&](int id) { return b.node_address(address, id); };
  // The staged inputs' copies, ahead of the first launch (the nodes read them there).
  if (b.staging) {
    const std::span<const int64_t> v = size_values(S);
    for (size_t id = 0; id < b.staged.size(); ++id) {
      if (b.staged[id] < 0) continue;
      const int64_t bytes = v[static_cast<size_t>(table_.buffer_bytes[id])];
      if (bytes > 0)
        drv::check(api.cuMemcpyDtoDAsync(b.staging_base + static_cast<uint64_t>(b.staged[id]), address(static_cast<int>(id)),
                                         static_cast<size_t>(bytes), stream),
                   fmt::format("cuMemcpyDtoDAsync(graph input buffer {} into its copy)", id));
    }
  }
  auto patch = [&](Bucket::Segment& sg) {
    const std::span<const int64_t> v = size_values(S);
    for (Bucket::Node& nd : sg.nodes) {
      if (nd.lib) continue;
      // Same sizes and no input/output argument: the node's launch cannot have changed.
      if (same_sizes && nd.plan->io_params.empty()) continue;
      const size_t ki = static_cast<size_t>(nd.plan->kernel);
      // New sizes, but arguments of arena regions, constants and the sizes' memory only (every address
      // fixed in the bucket): the launch follows the variant the sizes allow and its rule's work and
      // row length (at the bucket's bound where the node is launched there); unchanged, nothing can be.
      // A tuned variant (max-autotune's winner for the bucket) adds what its own rule asks of the sizes
      // and its launch rule's work and row length (node_launch).
      if (nd.plan->fixed_arguments()) {
        const NodeLaunchKey key = launch_key(b, ki, v);
        if (key == nd.launch_key) continue;
        nd.launch_key = key;
      }
      ++recomputed;
      const CudaKernel& k = p_.kernels[ki];
      scratch = nd.block;
      for (const KernelParam& a : k.params) scratch[a.offset / 8] = param_value(a, node_address, S, sizes_address_);
      bool aligned = sizes_allow_aligned(p_, table_, v, ki);
      for (int id : k.rule.aligned_buffers) aligned = aligned && node_address(id) % 16 == 0;
      LaunchDims d = launch_dims_of(p_, table_, dims_values(b, ki, v), ki, aligned);
      const auto& fns = functions_[ki];
      drv::KernelNodeParams next = nd.applied;
      next.func = aligned ? fns.first : fns.second;
      node_launch(b, ki, v, aligned, node_address, next.func, d);
      next.grid_x = d.grid;
      next.block_x = d.block;
      next.shared_bytes = d.shared_bytes;
      if (scratch == nd.block && next.func == nd.applied.func && next.grid_x == nd.applied.grid_x &&
          next.block_x == nd.applied.block_x && next.shared_bytes == nd.applied.shared_bytes)
        continue;
      std::copy(scratch.begin(), scratch.end(), nd.block.begin());  // params point into nd.block
      next.kernel_params = nd.params.data();
      const Clock::time_point d0 = size_change ? Clock::now() : Clock::time_point{};
      if (const drv::CUresult rc = api.cuGraphExecKernelNodeSetParams(sg.exec, nd.node, &next); rc != drv::kCudaSuccess)
        drv::check(rc, fmt::format("cuGraphExecKernelNodeSetParams({}, grid {})", k.name, next.grid_x));
      if (size_change) driver_ns += ns_since(d0);
      nd.applied = next;
      ++patches;
      if (log_patched) patched.push_back(k.name);
    }
  };
  // Segments in program order, each patched right before its launch, other steps between them: at a
  // new size the device runs the first segments while the host patches the next (pipeline_chunks).
  size_t seg = 0;
  for (size_t i = 0; i < p_.steps.size();) {
    if (seg < segments_.size() && segments_[seg].first == i) {
      Bucket::Segment& sg = b.segments[seg];
      Clock::time_point t = size_change ? Clock::now() : Clock::time_point{};
      if (!just_recorded) patch(sg);
      if (size_change) {
        patch_ns += ns_since(t);
        t = Clock::now();
      }
      drv::check(api.cuGraphLaunch(sg.exec, stream), "cuGraphLaunch");
      if (size_change) {
        launch_ns += ns_since(t);
        if (first_launch_ns < 0) {
          first_launch_ns = ns_since(change_t0_);
          first_patches = patches;
        }
      }
      i = segments_[seg].end;
      ++seg;
      continue;
    }
    run_step(p_.steps[i]);
    ++i;
  }
  b.last_sizes.assign(S.begin(), S.end());
  count_graph_replay(patches);
  if (size_change) {
    // The host cost of a new size inside a known bucket: prepare's checks, the patches, the launches.
    const int64_t check_ns = std::max<int64_t>(change_check_ns_, 0);
    count_graph_size_change(check_ns + patch_ns + launch_ns, check_ns, std::max<int64_t>(first_launch_ns, 0));
    if (log_patched) {
      std::string sizes;
      for (size_t i = 0; i < S.size(); ++i) sizes += fmt::format("{}{}={}", i ? ", " : "", sym::print(p_.symbols[i]), S[i]);
      // the patched kernels, each once with its count, in program order
      std::string names;
      for (size_t i = 0; i < patched.size(); ++i) {
        if (std::find(patched.begin(), patched.begin() + static_cast<std::ptrdiff_t>(i), patched[i]) !=
            patched.begin() + static_cast<std::ptrdiff_t>(i))
          continue;
        const auto n = std::count(patched.begin(), patched.end(), patched[i]);
        names += fmt::format("{}{}{}", names.empty() ? "" : ", ", patched[i], n > 1 ? fmt::format(" x{}", n) : "");
      }
      observe::log_line(observe::LogCat::Graphs, in_.compile_id,
                        fmt::format("new sizes {} in bucket {} of '{}': {:.1f} us on the host (checks {:.1f} us over {} "
                                    "size expressions, {} node(s) patched in {:.1f} us of which the driver {:.1f} us, "
                                    "{} launch(es) {:.1f} us; first launch after {:.1f} us, {} node(s) patched before it; {} node(s) "
                                    "recomputed){}",
                                    sizes, b.index, p_.name, (check_ns + patch_ns + launch_ns) / 1e3, check_ns / 1e3,
                                    table_.exprs.size(), patches, patch_ns / 1e3, driver_ns / 1e3, segments_.size(),
                                    launch_ns / 1e3, std::max<int64_t>(first_launch_ns, 0) / 1e3, first_patches, recomputed,
                                    names.empty() ? std::string() : "; patched: " + names));
    }
  }
}

}  // namespace protean::backend::cuda
