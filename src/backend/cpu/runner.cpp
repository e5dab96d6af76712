#include "backend/cpu/runner.h"
#include "backend/cpu/sdpa.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "ir/sym_util.h"
#include "backend/donation.h"
#include "backend/registry.h"
#include "core/rethrow.h"
#include "ops/dispatch.h"
#include "ops/dnnl_stats.h"
#include "protean/autograd.h"
#include "ops/registry.h"
#include "ops/thread_binding.h"
#include "protean/tensor_version.h"
#include "sym/printer.h"

namespace protean::backend::cpu {

using namespace loop;  // the IR this file runs

namespace {
/// The unbacked symbol a local_scalar_dense extern defines (its `symbol` attribute), or nullptr.
sym::Expr value_symbol(const Extern& e) {
  if (e.op != ops::OpKind::local_scalar_dense) return nullptr;
  const ops::AttrValue* a = e.attrs.find("symbol");
  if (!a || !std::holds_alternative<SymInt>(*a) || !std::get<SymInt>(*a).is_symbolic()) return nullptr;
  sym::Expr x = ir::to_expr(std::get<SymInt>(*a));
  return x->is_symbol() ? x : nullptr;
}

/// Calls fn(buffer, index) for every Load in e.
void for_each_load(const SExpr& e, const std::function<void(int, const sym::Expr&)>& fn) {
  if (!e) return;
  if (e->op == SOp::Load) fn(e->buffer, e->index);
  for (const SExpr& a : e->args) for_each_load(a, fn);
}

/// Whether output buffer `out` may be written into the memory of input buffer `in` (input donation):
/// `out` is first written by a pointwise stage of a kernel whose every read of `in` (in that stage or
/// an earlier stage of the same kernel) is at the element the stage writes, so each element is read
/// before it is overwritten, by the same loop iteration; and no later step reads `in` or a result an
/// extern computed from it (a view of it, conservatively any extern result); and no output is `in`
/// itself or such a view of it.
bool donation_safe(const Program& p, int in, int out) {
  std::vector<bool> alias(p.buffers.size(), false);
  alias[static_cast<size_t>(in)] = true;
  bool written = false;
  for (const Step& st : p.steps) {
    if (!st.is_kernel) {
      const Extern& e = p.externs[static_cast<size_t>(st.index)];
      bool reads = false;
      for (int b : e.inputs) reads = reads || (b >= 0 && alias[static_cast<size_t>(b)]);
      if (!reads) continue;
      if (written) return false;
      for (int b : e.outputs) alias[static_cast<size_t>(b)] = true;
      continue;
    }
    const Kernel& k = p.kernels[static_cast<size_t>(st.index)];
    int ws = -1;  // the stage writing `out`
    for (size_t j = 0; j < k.stages.size(); ++j) {
      const Stage& s = k.stages[j];
      if (s.out2 == out || s.stash == out) return false;
      if (s.out == out && ws < 0) ws = static_cast<int>(j);
    }
    bool bad = false, reads = false;
    for (size_t j = 0; j < k.stages.size(); ++j)
      for_each_load(k.stages[j].body, [&](int b, const sym::Expr& index) {
        if (!alias[static_cast<size_t>(b)]) return;
        reads = true;
        if (written || ws < 0) return;
        const Stage& w = k.stages[static_cast<size_t>(ws)];
        if (b != in || static_cast<int>(j) > ws || !w.out_index || !index ||
            !(index == w.out_index || sym::print(index) == sym::print(w.out_index)))
          bad = true;
      });
    if (written && reads) return false;
    if (ws >= 0 && !written) {
      if (bad || k.stages[static_cast<size_t>(ws)].kind != StageKind::Pointwise) return false;
      written = true;
    }
  }
  // The caller reads every output after the last step: `in` returned as it is (a parameter arena a
  // training step passes through), placed in an output, or viewed by an extern result that is returned
  // must keep its values.
  for (int o : p.outputs) {
    const Buffer& ob = p.buffers[static_cast<size_t>(o)];
    if (alias[static_cast<size_t>(o)] || ob.alias == in) return false;
  }
  return written;
}
}  // namespace

bool extern_result_is_fresh(const Extern& e) {
  if (!e.branches.empty()) return false;
  using ops::OpKind;
  switch (e.op) {
    case OpKind::conv1d:
    case OpKind::conv1d_fused:
    case OpKind::conv2d:
    case OpKind::conv2d_fused:
    case OpKind::conv_transpose2d:
    case OpKind::conv_transpose2d_fused:
    case OpKind::linear:
    case OpKind::linear_fused:
    case OpKind::matmul:
    case OpKind::matmul_fused:
    case OpKind::bmm:
    case OpKind::avg_pool2d:
    case OpKind::max_pool2d:
    case OpKind::adaptive_avg_pool2d:
    case OpKind::upsample_nearest2d:
    case OpKind::upsample_bilinear2d:
    case OpKind::scaled_dot_product_attention:
      return true;
    default:
      return false;
  }
}

CpuArtifact::CpuArtifact(Program p, size_t given, std::shared_ptr<const cache::Library> lib,
                         std::vector<sym::RuntimeAssert> asserts, std::vector<std::vector<int>> kernel_buffers)
    : p_(std::move(p)), given_(given), lib_(std::move(lib)), kernel_buffers_(std::move(kernel_buffers)),
      asserts_(std::move(asserts)) {
  if (!kernel_buffers_.empty() && kernel_buffers_.size() != p_.kernels.size())
    throw CompileError(fmt::format("cpu: {} kernel buffer tables for {} kernels", kernel_buffers_.size(), p_.kernels.size()));
  for (size_t i = 0; i < p_.symbols.size(); ++i) sym_index_.emplace(p_.symbols[i], i);
  for (const Kernel& k : p_.kernels) {
    auto f = reinterpret_cast<KernelFn>(lib_ ? lib_->symbol(k.name.c_str()) : nullptr);
    if (!f) throw CompileError(fmt::format("cpu: kernel {} missing from {}", k.name, lib_ ? lib_->path : "(no library)"));
    fns_.push_back(f);
  }
  int ninputs = 0;
  for (const Buffer& b : p_.buffers)
    if (b.kind == BufferKind::Input) ninputs = std::max(ninputs, b.input_index + 1);
  input_buffer_.assign(static_cast<size_t>(ninputs), -1);
  for (const Buffer& b : p_.buffers)
    if (b.kind == BufferKind::Input) input_buffer_[static_cast<size_t>(b.input_index)] = b.id;
  for (size_t i = given_; i < p_.symbols.size(); ++i) {
    std::pair<int, int> where{-1, -1};
    for (size_t in = 0; in < input_buffer_.size() && where.first < 0; ++in) {
      const Buffer& b = p_.buffers[static_cast<size_t>(input_buffer_[in])];
      for (size_t d = 0; d < b.sizes.size(); ++d)
        if (b.sizes[d] == p_.symbols[i]) {
          where = {static_cast<int>(in), static_cast<int>(d)};
          break;
        }
    }
    // item_symint's value: read from the local_scalar_dense extern's one-element result (before the
    // size search below: a later extern may carry the symbol in its sizes)
    for (size_t ei = 0; ei < p_.externs.size() && where.first == -1; ++ei)
      if (value_symbol(p_.externs[ei]) == p_.symbols[i]) {
        late_binds_.resize(p_.externs.size());
        late_binds_[ei].push_back({0, 0, i, true});
        where = {-2, -2};
        has_late_ = true;
      }
    if (where.first == -1) {
      // an unbacked size (e.g. nonzero's row count): read from the extern that produces it
      for (size_t ei = 0; ei < p_.externs.size() && where.first < 0; ++ei)
        for (size_t o = 0; o < p_.externs[ei].outputs.size() && where.first < 0; ++o) {
          const Buffer& b = p_.buffers[static_cast<size_t>(p_.externs[ei].outputs[o])];
          for (size_t d = 0; d < b.sizes.size(); ++d)
            if (b.sizes[d] == p_.symbols[i]) {
              late_binds_.resize(p_.externs.size());
              late_binds_[ei].push_back({o, d, i, false});
              where = {-2, -2};
              has_late_ = true;
              break;
            }
        }
    }
    if (where.first == -1)
      throw CompileError(fmt::format("cpu: symbol {} is neither passed by the dispatcher nor an input size",
                                     p_.symbols[i]->name));
    bind_from_input_.push_back(where);
  }
  // Input donation: which inputs each output may be written into.
  donors_.resize(p_.outputs.size());
  for (size_t k = 0; k < p_.outputs.size(); ++k) {
    const Buffer& o = p_.buffers[static_cast<size_t>(p_.outputs[k])];
    if (o.kind != BufferKind::Output || o.from_extern || o.slot >= 0) continue;
    for (size_t in = 0; in < input_buffer_.size(); ++in) {
      if (input_buffer_[in] < 0) continue;
      const Buffer& b = p_.buffers[static_cast<size_t>(input_buffer_[in])];
      if (b.dtype != o.dtype || b.sizes.size() != o.sizes.size()) continue;
      bool same = true;
      for (size_t d = 0; d < b.sizes.size() && same; ++d)
        same = b.sizes[d] == o.sizes[d] || sym::print(b.sizes[d]) == sym::print(o.sizes[d]);
      if (same && donation_safe(p_, b.id, o.id)) donors_[k].push_back(static_cast<int>(in));
    }
  }
  late_binds_.resize(p_.externs.size());
  alloc_before_.resize(p_.steps.size());
  std::vector<bool> seen(p_.buffers.size(), false);
  for (size_t si = 0; si < p_.steps.size(); ++si) {
    if (!p_.steps[si].is_kernel) {
      // an extern that writes its result into a region of another buffer needs that buffer first
      for (int o : p_.externs[static_cast<size_t>(p_.steps[si].index)].outputs)
        if (const int a = p_.buffers[static_cast<size_t>(o)].alias; a >= 0 && !seen[static_cast<size_t>(a)]) {
          seen[static_cast<size_t>(a)] = true;
          alloc_before_[si].push_back(a);
        }
      continue;
    }
    for (const Stage& s : p_.kernels[static_cast<size_t>(p_.steps[si].index)].stages)
      for (int o : {s.out, s.out2})
        if (o >= 0 && !seen[static_cast<size_t>(o)]) {
          seen[static_cast<size_t>(o)] = true;
          alloc_before_[si].push_back(o);
        }
  }
  for (const Extern& e : p_.externs) {
    std::vector<SymAttr> sa;
    const auto& items = e.attrs.items();
    const bool defines_value = value_symbol(e) != nullptr;  // its `symbol` is bound after it runs
    for (uint32_t a = 0; a < items.size(); ++a) {
      if (defines_value && items[a].name == "symbol") continue;
      if (const auto* si = std::get_if<SymInt>(&items[a].value)) {
        if (si->is_symbolic()) sa.push_back({a, -1, ir::to_expr(*si)});
      } else if (const auto* sv = std::get_if<SymIntVec>(&items[a].value)) {
        for (size_t k = 0; k < sv->size(); ++k)
          if ((*sv)[k].is_symbolic()) sa.push_back({a, static_cast<int32_t>(k), ir::to_expr((*sv)[k])});
      }
    }
    extern_sym_attrs_.push_back(std::move(sa));
  }
  // Meta functions memoized per symbol values: ops whose outputs are new tensors (no views, no
  // data-dependent sizes), in programs whose sizes are all known before the first step.
  memo_meta_.assign(p_.externs.size(), false);
  for (size_t k = 0; k < p_.externs.size() && !has_late_; ++k) {
    const Extern& e = p_.externs[k];
    const ops::OpInfo& info = ops::op_info(e.op);
    memo_meta_[k] = e.branches.empty() && e.op != ops::OpKind::call_region && e.op != ops::OpKind::cond &&
                    info.category != ops::OpCategory::View && info.category != ops::OpCategory::DataDependent &&
                    info.category != ops::OpCategory::ControlFlow &&
                    !(info.flags & (ops::kView | ops::kDataDependentShape | ops::kUnbackedSymbol)) &&
                    ops::meta_fn(e.op) && ops::kernel_fn(e.op);
  }
  if (const char* v = std::getenv("PROTEAN_CPU_PREWARM"); !(v && std::strcmp(v, "0") == 0)) {
    for (size_t k = 0; k < p_.externs.size(); ++k) {
      using ops::OpKind;
      const OpKind op = p_.externs[k].op;
      const bool conv = op == OpKind::conv1d || op == OpKind::conv1d_fused || op == OpKind::conv2d ||
                        op == OpKind::conv2d_fused || op == OpKind::conv_transpose2d ||
                        op == OpKind::conv_transpose2d_fused || op == OpKind::conv2d_backward_input ||
                        op == OpKind::conv2d_backward_weight;
      if (conv && p_.externs[k].branches.empty()) prewarm_externs_.push_back(k);
    }
    // One conv has nothing to overlap with.
    if (prewarm_externs_.size() < 2) prewarm_externs_.clear();
  }
  // Runtime assertions: after the extern that binds the last of their late symbols, else up front.
  asserts_after_extern_.resize(p_.externs.size());
  for (size_t k = 0; k < asserts_.size(); ++k) {
    int64_t after = -1;
    for (sym::Expr f : sym::free_symbols(asserts_[k].expr))
      for (size_t ei = 0; ei < late_binds_.size(); ++ei)
        for (const LateBind& lb : late_binds_[ei])
          if (p_.symbols[lb.symbol] == f) after = std::max<int64_t>(after, static_cast<int64_t>(ei));
    if (after < 0) asserts_at_start_.push_back(k);
    else asserts_after_extern_[static_cast<size_t>(after)].push_back(k);
  }
}

CpuArtifact::~CpuArtifact() {
  if (prewarm_.joinable()) prewarm_.join();
}

void CpuArtifact::start_prewarm(std::span<const Tensor> inputs, const std::vector<Tensor>& constants,
                                const std::function<int64_t(sym::Expr)>& lookup) const {
  // Each job: the op, its attributes with symbols evaluated, and per input either the tensor (a
  // constant or graph input) or the sizes and dtype of a stand-in.
  struct Arg {
    Tensor t;
    IntVec sizes;
    DType dtype = DType::F32;
    bool none = false;
  };
  struct Job {
    ops::OpKind op;
    ops::Attrs attrs;
    std::vector<Arg> args;
  };
  std::vector<Job> jobs;
  for (size_t k : prewarm_externs_) {
    const Extern& e = p_.externs[k];
    try {
      Job j{e.op, e.attrs, {}};
      for (const SymAttr& a : extern_sym_attrs_[k]) {
        auto& items = j.attrs.items();
        int64_t v = sym::evaluate(a.expr, lookup);
        if (a.element < 0) items[a.attr].value = SymInt(v);
        else std::get<SymIntVec>(items[a.attr].value)[static_cast<size_t>(a.element)] = SymInt(v);
      }
      bool f32 = true;
      for (int b : e.inputs) {
        Arg arg;
        if (b < 0) {
          arg.none = true;
        } else if (constants[static_cast<size_t>(b)].defined()) {
          arg.t = constants[static_cast<size_t>(b)];
        } else {
          const Buffer& buf = p_.buffers[static_cast<size_t>(b)];
          auto in = std::find(input_buffer_.begin(), input_buffer_.end(), b);
          if (in != input_buffer_.end()) {
            arg.t = inputs[static_cast<size_t>(in - input_buffer_.begin())];
          } else {
            for (auto x : buf.sizes) arg.sizes.push_back(sym::evaluate(x, lookup));
            arg.dtype = buf.dtype;
          }
        }
        j.args.push_back(std::move(arg));
      }
      if (!j.args.empty() && !j.args[0].none)
        f32 = (j.args[0].t.defined() ? j.args[0].t.dtype() : j.args[0].dtype) == DType::F32;
      if (f32) jobs.push_back(std::move(j));
    } catch (const Error&) {
      // a late-bound size or an attribute that does not evaluate yet: the run builds this one itself
    }
  }
  if (jobs.empty()) return;
  prewarm_ = std::thread([jobs = std::move(jobs)] {
    ops::DnnlPrepareOnly prepare;
    NoGradGuard no_grad;
    for (const Job& j : jobs) {
      try {
        std::vector<Tensor> in;
        for (const Arg& a : j.args)
          in.push_back(a.none ? Tensor() : a.t.defined() ? a.t : empty(a.sizes, a.dtype));
        ops::run_eager(j.op, in, j.attrs);
      } catch (...) {
        // best effort: the run reports any real error itself
      }
    }
  });
}

Tensor CpuArtifact::take_slot_block(int64_t bytes) const {
  std::vector<Tensor> smaller;  // released below, before the new block is allocated
  {
    std::lock_guard<std::mutex> lock(slot_mu_);
    // the smallest kept block that holds this call's slots
    size_t best = slot_blocks_.size();
    for (size_t i = 0; i < slot_blocks_.size(); ++i)
      if (slot_blocks_[i].int_numel() >= bytes &&
          (best == slot_blocks_.size() || slot_blocks_[i].int_numel() < slot_blocks_[best].int_numel()))
        best = i;
    if (best < slot_blocks_.size()) {
      Tensor t = std::move(slot_blocks_[best]);
      slot_blocks_.erase(slot_blocks_.begin() + static_cast<int64_t>(best));
      return t;
    }
    // Every kept block is too small for this call (a longer sequence than before), and after the
    // call give_slot_block would keep the new, larger block instead. Released now, the old block is
    // never resident beside the new one: a training step whose length grew kept the previous
    // length's block idle through the whole call (train_bench's GPT at T = 256: the 58 MiB block of
    // T = 224 beside the 66 MiB one, most of its peak RSS above libtorch's).
    smaller = std::move(slot_blocks_);
    slot_blocks_.clear();
  }
  smaller.clear();
  return empty({bytes}, DType::U8);
}

void CpuArtifact::give_slot_block(Tensor block) const {
  std::lock_guard<std::mutex> lock(slot_mu_);
  // One block is kept, the largest: a run that found it taken by a concurrent run allocated its own.
  if (slot_blocks_.empty()) slot_blocks_.push_back(std::move(block));
  else if (slot_blocks_[0].int_numel() < block.int_numel()) slot_blocks_[0] = std::move(block);
}

void CpuArtifact::check_assert(const sym::RuntimeAssert& a, const std::function<int64_t(sym::Expr)>& lookup) const {
  int64_t ok = 0;
  try {
    ok = sym::evaluate(a.expr, lookup);
  } catch (const CompileError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError(fmt::format("cpu: graph '{}': cannot evaluate the runtime assertion {} ({}): {}", p_.name,
                                   sym::print(a.expr), a.message, e.what()));
  }
  if (ok) return;
  std::string values;
  for (sym::Expr f : sym::free_symbols(a.expr)) values += fmt::format("{}{} = {}", values.empty() ? "" : ", ", f->name, lookup(f));
  throw RuntimeError(fmt::format("graph '{}': runtime assertion {} failed for {} ({}{}): a value read at run time "
                                 "breaks a fact the graph was compiled under",
                                 p_.name, sym::print(a.expr), values, a.message,
                                 a.where.empty() ? "" : ", at " + a.where.describe()));
}

namespace {
/// A cond extern: reads the predicate (in[0]) and runs the taken branch's program on the other inputs
/// with this program's symbol values. An output that shares storage with an input is copied: inputs
/// may live in a memory slot that a later step reuses.
/// A call_region extern: the region's program (shared by every use of the body) on all inputs, with
/// this program's symbol values; outputs that alias an input are copied as for a cond.
std::vector<Tensor> run_region(const Extern& e, std::span<const Tensor> in, std::span<const int64_t> symbols) {
  if (e.branches.size() != 1) throw CompileError("cpu: a call_region step needs exactly one compiled body");
  std::vector<Tensor> out = e.branches[0]->run(in, symbols);
  for (Tensor& t : out)
    for (const Tensor& x : in)
      if (x.defined() && t.impl()->storage == x.impl()->storage) {
        std::vector<Tensor> one{t};
        t = ops::run_eager(ops::OpKind::clone, one, {}).at(0);
        break;
      }
  return out;
}

std::vector<Tensor> run_cond(const Extern& e, std::span<const Tensor> in, std::span<const int64_t> symbols) {
  const Tensor& p = in[0];
  if (!p.defined() || p.dtype() != DType::Bool || p.int_numel() != 1)
    throw ValueError("cpu: the predicate of a cond must be a bool tensor with one element");
  bool taken;
  {
    ops::TraceHookScope no_hook(nullptr);
    taken = *static_cast<const bool*>(p.data_ptr());
  }
  std::vector<Tensor> out = e.branches[taken ? 0 : 1]->run(in.subspan(1), symbols);
  for (Tensor& t : out)
    for (const Tensor& x : in)
      if (x.defined() && t.impl()->storage == x.impl()->storage) {
        std::vector<Tensor> one{t};
        t = ops::run_eager(ops::OpKind::clone, one, {}).at(0);
        break;
      }
  return out;
}
}  // namespace

std::vector<Tensor> CpuArtifact::run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const {
  // Taken before anything else, so graphs nested in this call (cond branches, regions) never see it.
  const std::vector<const void*> donated = take_donation();
  // A GEMM or convolution that binds the OpenMP team to distinct CPUs (ops/thread_binding.h) keeps it
  // bound for the rest of the run: the generated kernels and post-op passes after it run bound too.
  ops::TeamBindingScope team_scope;
  if (inputs.size() != input_buffer_.size())
    throw ValueError(fmt::format("graph '{}' takes {} inputs, got {}", p_.name, input_buffer_.size(), inputs.size()));
  // ---- symbol values ----
  std::vector<int64_t> S(p_.symbols.size(), 0);
  for (size_t i = 0; i < given_ && i < symbol_values.size(); ++i) S[i] = symbol_values[i];
  for (size_t i = 0; i < bind_from_input_.size(); ++i) {
    auto [in, d] = bind_from_input_[i];
    if (in >= 0) S[given_ + i] = inputs[static_cast<size_t>(in)].sizes().at(static_cast<size_t>(d)).hint();
  }
  auto lookup = [&](sym::Expr s) -> int64_t {
    auto it = sym_index_.find(s);
    if (it == sym_index_.end()) throw CompileError(fmt::format("cpu: unbound symbol {}", s->name));
    return S[it->second];
  };
  for (size_t k : asserts_at_start_) check_assert(asserts_[k], lookup);
  auto eval_sizes = [&](const Buffer& b) {
    IntVec v;
    for (auto e : b.sizes) v.push_back(sym::evaluate(e, lookup));
    return v;
  };
  const size_t nb = p_.buffers.size();
  std::vector<Tensor> bufs(nb);
  std::vector<char*> ptrs(nb, nullptr);
  auto set = [&](size_t b, Tensor t) {
    ptrs[b] = t.int_numel() > 0 ? static_cast<char*>(t.data_ptr()) : nullptr;
    bufs[b] = std::move(t);
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Buffer& b = p_.buffers[static_cast<size_t>(input_buffer_[i])];
    const Tensor& t = inputs[i];
    if (!t.defined() || t.dtype() != b.dtype || static_cast<size_t>(t.dim()) != b.sizes.size())
      throw TypeError(fmt::format("graph '{}' input {} should be {} with {} dims", p_.name, i, short_name(b.dtype),
                                  b.sizes.size()));
    set(static_cast<size_t>(b.id), t.is_contiguous() ? t : t.contiguous());
  }
  for (const Buffer& b : p_.buffers)
    if (b.kind == BufferKind::Constant) set(static_cast<size_t>(b.id), b.constant);
  if (!prewarm_externs_.empty())
    std::call_once(prewarm_once_, [&] { start_prewarm(inputs, bufs, lookup); });
  // Slots are sized up front from this call's symbol values (all known unless an extern binds an
  // unbacked size later; then every buffer is allocated on its own when first written).
  std::vector<char*> slots;
  struct BlockReturn {
    const CpuArtifact* self;
    Tensor block;
    ~BlockReturn() {
      if (block.defined()) self->give_slot_block(std::move(block));
    }
  } slot_block{this, Tensor()};
  if (!has_late_ && p_.num_slots > 0) {
    std::vector<int64_t> slot_bytes(static_cast<size_t>(p_.num_slots), 0);
    for (const Buffer& b : p_.buffers) {
      if (b.slot < 0) continue;
      int64_t n = static_cast<int64_t>(itemsize(b.dtype));
      for (int64_t s : eval_sizes(b)) n *= s;
      slot_bytes[static_cast<size_t>(b.slot)] = std::max(slot_bytes[static_cast<size_t>(b.slot)], n);
    }
    std::vector<int64_t> offset;
    int64_t total = 0;
    for (int64_t n : slot_bytes) {
      offset.push_back(total);
      total += (std::max<int64_t>(n, 1) + 63) / 64 * 64;
    }
    slot_block.block = take_slot_block(total);
    char* base = static_cast<char*>(slot_block.block.data_ptr());
    for (int64_t o : offset) slots.push_back(base + o);
  }
  const char* slot_lo = slot_block.block.defined() ? static_cast<const char*>(slot_block.block.data_ptr()) : nullptr;
  const char* slot_hi = slot_lo ? slot_lo + slot_block.block.int_numel() : nullptr;
  // Donated inputs: an output goes into the first donated, contiguous, unshared input it may alias.
  std::vector<int> donor(nb, -1);
  if (!donated.empty()) {
    std::vector<bool> used(inputs.size(), false);
    auto is_donated = [&](const Tensor& t) {
      return t.defined() && t.int_numel() > 0 && t.is_contiguous() &&
             std::find(donated.begin(), donated.end(), t.data_ptr()) != donated.end();
    };
    auto shared = [&](size_t in) {
      for (size_t j = 0; j < inputs.size(); ++j)
        if (j != in && inputs[j].defined() && inputs[j].impl()->storage == inputs[in].impl()->storage) return true;
      return false;
    };
    for (size_t k = 0; k < p_.outputs.size(); ++k)
      for (int in : donors_[k]) {
        const size_t i = static_cast<size_t>(in);
        if (used[i] || !is_donated(inputs[i]) || shared(i)) continue;
        used[i] = true;
        donor[static_cast<size_t>(p_.outputs[k])] = in;
        break;
      }
  }
  auto allocate = [&](const Buffer& b) {
    IntVec sz = eval_sizes(b);
    if (const int in = donor[static_cast<size_t>(b.id)]; in >= 0 && inputs[static_cast<size_t>(in)].int_sizes() == sz) {
      increment_version(inputs[static_cast<size_t>(in)]);  // its bytes are about to be overwritten
      set(static_cast<size_t>(b.id), inputs[static_cast<size_t>(in)]);
      return;
    }
    if (b.slot >= 0 && !slots.empty())
      set(static_cast<size_t>(b.id), from_blob(slots[static_cast<size_t>(b.slot)], sz, b.dtype));
    else
      set(static_cast<size_t>(b.id), empty(sz, b.dtype));
  };
  // ---- extern output metadata memoized for these symbol values (see runner.h) ----
  std::shared_ptr<const MetaMemo> memo;
  std::shared_ptr<MetaMemo> fresh_memo;
  if (!has_late_) {
    {
      std::lock_guard<std::mutex> lock(memo_mu_);
      if (memo_ && memo_->S == S) memo = memo_;
    }
    if (!memo) {
      fresh_memo = std::make_shared<MetaMemo>();
      fresh_memo->S = S;
      fresh_memo->metas.resize(p_.externs.size());
    }
  }
  // Runs extern k's kernel: meta function (or its memoized result), then the kernel, which may take
  // `places` (this step's output slots) as its result memory.
  std::vector<ops::OutputPlace> places;
  // `places` = the slots of extern e's outputs that the plan gave to its result, and the regions of
  // other buffers that outputs are written into (Buffer::alias)
  auto alias_data = [&](const Buffer& b) {
    return static_cast<char*>(bufs[static_cast<size_t>(b.alias)].data_ptr()) + b.alias_offset * static_cast<int64_t>(itemsize(b.dtype));
  };
  auto place_outputs = [&](const Extern& e) {
    places.clear();
    for (int o : e.outputs) {
      const Buffer& b = p_.buffers[static_cast<size_t>(o)];
      if (b.alias >= 0) places.push_back({alias_data(b), eval_sizes(b), b.dtype});
      else if (!slots.empty() && b.slot >= 0 && b.from_extern)
        places.push_back({slots[static_cast<size_t>(b.slot)], eval_sizes(b), b.dtype});
    }
  };
  auto run_extern = [&](size_t k, std::span<const Tensor> args, const ops::Attrs& attrs) -> std::vector<Tensor> {
    const Extern& e = p_.externs[k];
    place_outputs(e);
    std::optional<ops::OutputPlacementScope> placed;
    if (!places.empty()) placed.emplace(places);
    bool host = true;
    for (const Tensor& t : args) host = host && (!t.defined() || (t.device().type == DeviceType::CPU && !t.is_fake()));
    if (!memo_meta_[k] || !host) return ops::run_eager(e.op, args, attrs);
    if (memo && !memo->metas[k].empty()) return ops::kernel_fn(e.op)(args, attrs, memo->metas[k]);
    std::vector<TensorMeta> metas = ops::run_meta(e.op, args, attrs);
    if (fresh_memo) fresh_memo->metas[k] = metas;
    return ops::kernel_fn(e.op)(args, attrs, metas);
  };
  // ---- steps ----
  std::vector<Tensor> in;
  std::vector<char*> local;  // a kernel's own pointer table (kernel dedup)
  for (size_t si = 0; si < p_.steps.size(); ++si) {
    const Step& st = p_.steps[si];
    for (int b : alloc_before_[si]) allocate(p_.buffers[static_cast<size_t>(b)]);
    if (st.is_kernel) {
      if (kernel_buffers_.empty()) {
        fns_[static_cast<size_t>(st.index)](ptrs.data(), S.data());
      } else {
        local.clear();
        for (int b : kernel_buffers_[static_cast<size_t>(st.index)]) local.push_back(ptrs[static_cast<size_t>(b)]);
        fns_[static_cast<size_t>(st.index)](local.data(), S.data());
      }
    } else {
      const Extern& e = p_.externs[static_cast<size_t>(st.index)];
      in.clear();
      for (size_t k = 0; k < e.inputs.size(); ++k) {
        const int b = e.inputs[k];
        if (b < 0) {
          in.push_back(Tensor());
        } else if (k < e.views.size() && e.views[k].offset) {
          // a strided view of the buffer, read in place by the op (loop_ir.h: ExternView)
          const ExternView& v = e.views[k];
          const Tensor& base = bufs[static_cast<size_t>(b)];
          TensorMeta m;
          m.dtype = base.dtype();
          m.device = base.device();
          for (size_t d = 0; d < v.sizes.size(); ++d) {
            m.sizes.push_back(SymInt(sym::evaluate(v.sizes[d], lookup)));
            m.strides.push_back(SymInt(sym::evaluate(v.strides[d], lookup)));
          }
          m.storage_offset = SymInt(base.storage_offset().hint() + sym::evaluate(v.offset, lookup));
          in.push_back(ops::make_view(base, m));
        } else {
          in.push_back(bufs[static_cast<size_t>(b)]);
        }
      }
      std::vector<Tensor> out;
      try {
        const auto& sa = extern_sym_attrs_[static_cast<size_t>(st.index)];
        if (e.op == ops::OpKind::call_region) {
          out = run_region(e, in, S);
        } else if (!e.branches.empty()) {
          out = run_cond(e, in, S);
        } else if (e.op == ops::OpKind::scaled_dot_product_attention && sa.empty()) {
          // the fused kernel where it applies (f32, contiguous, no mask), else the eager one
          std::optional<Tensor> r;
          {
            place_outputs(e);
            ops::OutputPlacementScope placed(places);
            r = sdpa_fused(in, e.attrs);
          }
          if (r) out.push_back(std::move(*r));
          else out = run_extern(static_cast<size_t>(st.index), in, e.attrs);
        } else if (sa.empty()) {
          out = run_extern(static_cast<size_t>(st.index), in, e.attrs);
        } else {
          ops::Attrs attrs = e.attrs;
          auto& items = attrs.items();
          for (const SymAttr& a : sa) {
            int64_t v = sym::evaluate(a.expr, lookup);
            if (a.element < 0) items[a.attr].value = SymInt(v);
            else std::get<SymIntVec>(items[a.attr].value)[static_cast<size_t>(a.element)] = SymInt(v);
          }
          out = run_extern(static_cast<size_t>(st.index), in, attrs);
        }
      } catch (const Error& err) {
        // a region's or a branch's own program names its nodes itself
        if (e.op == ops::OpKind::call_region || !e.branches.empty()) throw;
        core::rethrow_at(err, e.where);
      }
      in.clear();
      if (out.size() != e.outputs.size())
        throw RuntimeError(fmt::format("cpu: extern {} returned {} results, expected {}", ops::op_name(e.op), out.size(),
                                       e.outputs.size()));
      for (size_t k = 0; k < out.size(); ++k) {
        Tensor t = out[k].is_contiguous() ? out[k] : out[k].contiguous();
        const Buffer& b = p_.buffers[static_cast<size_t>(e.outputs[k])];
        // A result in the slot block that is not this buffer's own slot is a view of an input's slot
        // memory (a slice, a reshape): that slot is reused after the input's last use, which does not
        // wait for this result's readers, so the result gets its own copy.
        if (slot_lo && b.alias < 0 && t.defined() && t.int_numel() > 0) {
          const char* d = static_cast<const char*>(t.data_ptr());
          const bool own = b.slot >= 0 && !slots.empty() && d == slots[static_cast<size_t>(b.slot)];
          if (d >= slot_lo && d < slot_hi && !own) {
            std::vector<Tensor> one{t};
            t = ops::run_eager(ops::OpKind::clone, one, {}).at(0);
          }
        }
        if (b.alias >= 0) {
          // its region of the other buffer; copied there when the kernel did not take the place
          Tensor region = from_blob(alias_data(b), eval_sizes(b), b.dtype);
          if (t.data_ptr() != region.data_ptr()) {
            if (t.dtype() != b.dtype || t.int_numel() != region.int_numel())
              throw RuntimeError(fmt::format("cpu: extern {} returned {}, expected {} elements of {}", ops::op_name(e.op),
                                             ops::describe_call(e.op, std::span<const Tensor>(&t, 1)), region.int_numel(),
                                             short_name(b.dtype)));
            std::memcpy(region.data_ptr(), t.data_ptr(), static_cast<size_t>(region.int_numel()) * itemsize(b.dtype));
          }
          t = std::move(region);
        }
        set(static_cast<size_t>(e.outputs[k]), std::move(t));
      }
      for (const LateBind& lb : late_binds_[static_cast<size_t>(st.index)]) {
        const Tensor& r = bufs[static_cast<size_t>(e.outputs[lb.output])];
        if (!lb.value) {
          S[lb.symbol] = r.sizes().at(lb.dim).hint();
          continue;
        }
        ops::TraceHookScope no_hook(nullptr);  // a read of our own result, not of the user's data
        S[lb.symbol] = r.item<int64_t>();
      }
      for (size_t k : asserts_after_extern_[static_cast<size_t>(st.index)]) check_assert(asserts_[k], lookup);
    }
    for (int b : st.release) {
      bufs[static_cast<size_t>(b)] = Tensor();
      ptrs[static_cast<size_t>(b)] = nullptr;
    }
  }
  if (fresh_memo) {
    std::lock_guard<std::mutex> lock(memo_mu_);
    memo_ = std::move(fresh_memo);
  }
  std::vector<Tensor> result;
  // No result may live in slot memory (the next call reuses it): one that does — an op that returned
  // a view of its slot input, which extern_result_is_fresh should have excluded — is copied out.
  for (int o : p_.outputs) {
    Tensor t = bufs[static_cast<size_t>(o)];
    if (slot_lo && t.defined() && t.int_numel() > 0) {
      const char* d = static_cast<const char*>(t.data_ptr());
      if (d >= slot_lo && d < slot_hi) {
        std::vector<Tensor> one{t};
        t = ops::run_eager(ops::OpKind::clone, one, {}).at(0);
      }
    }
    result.push_back(std::move(t));
  }
  return result;
}

}  // namespace protean::backend::cpu
