#include "loop/verify.h"

#include <fmt/format.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "observe/env.h"
#include "protean/error.h"
#include "sym/printer.h"

namespace protean::loop {

namespace {

class Verifier {
 public:
  Verifier(const Program& p, std::string_view where) : p_(p), where_(where) {}

  void run() {
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      const Buffer& buf = p_.buffers[b];
      at_ = fmt::format("buffer b{}", b);
      if (buf.id != static_cast<int>(b)) fail(fmt::format("has id {}", buf.id));
      for (const auto& s : buf.sizes)
        if (!s) fail("has a missing size");
      if (buf.kind == BufferKind::Input && buf.input_index < 0) fail("is an input without an input index");
      if (p_.num_slots > 0 && buf.slot >= p_.num_slots) fail(fmt::format("has slot {} of {}", buf.slot, p_.num_slots));
      if (buf.alias >= 0) {
        // an extern result written into a region of another buffer (schedule.h)
        buffer_in_range(buf.alias);
        const Buffer& into = p_.buffers[static_cast<size_t>(buf.alias)];
        auto numel = [](const Buffer& x) -> int64_t {
          int64_t n = 1;
          for (const auto& s : x.sizes) {
            if (!s || !s->is_integer()) return -1;
            n *= s->value;
          }
          return n;
        };
        if (!buf.from_extern || buf.kind != BufferKind::Temp || buf.slot >= 0)
          fail("is written into another buffer but is not an unslotted extern temp");
        if (into.kind != BufferKind::Temp || into.from_extern || into.alias >= 0 || into.dtype != buf.dtype)
          fail(fmt::format("is written into b{}, which is not a temp of its dtype", buf.alias));
        if (numel(into) < 0 || numel(buf) < 0 || buf.alias_offset < 0 || buf.alias_offset + numel(buf) > numel(into))
          fail(fmt::format("is written into b{} at {}, outside it", buf.alias, buf.alias_offset));
      }
    }
    at_ = "program outputs";
    for (int o : p_.outputs) buffer_in_range(o);
    std::vector<int> kernel_runs(p_.kernels.size(), 0), extern_runs(p_.externs.size(), 0);
    int last_kernel = -1;
    written_.assign(p_.buffers.size(), false);
    for (size_t i = 0; i < p_.buffers.size(); ++i)
      written_[i] = p_.buffers[i].kind == BufferKind::Input || p_.buffers[i].kind == BufferKind::Constant;
    for (size_t si = 0; si < p_.steps.size(); ++si) {
      const Step& st = p_.steps[si];
      at_ = fmt::format("step {}", si);
      if (st.is_kernel) {
        if (st.index < 0 || static_cast<size_t>(st.index) >= p_.kernels.size()) fail(fmt::format("runs kernel {} of {}", st.index, p_.kernels.size()));
        if (st.index <= last_kernel) fail(fmt::format("runs kernel {} after kernel {} (kernels are numbered in step order)", st.index, last_kernel));
        last_kernel = st.index;
        ++kernel_runs[static_cast<size_t>(st.index)];
        kernel(p_.kernels[static_cast<size_t>(st.index)]);
      } else {
        if (st.index < 0 || static_cast<size_t>(st.index) >= p_.externs.size()) fail(fmt::format("runs extern {} of {}", st.index, p_.externs.size()));
        if (++extern_runs[static_cast<size_t>(st.index)] > 1) fail(fmt::format("runs extern {} a second time", st.index));
        const Extern& e = p_.externs[static_cast<size_t>(st.index)];
        for (int b : e.inputs)
          if (b >= 0) {
            buffer_in_range(b);
            if (!written_[static_cast<size_t>(b)]) fail(fmt::format("extern {} reads b{} before any step writes it", ops::op_name(e.op), b));
          }
        for (int b : e.outputs) {
          buffer_in_range(b);
          written_[static_cast<size_t>(b)] = true;
          if (const int a = p_.buffers[static_cast<size_t>(b)].alias; a >= 0) written_[static_cast<size_t>(a)] = true;
        }
      }
      for (int b : st.release) buffer_in_range(b);
    }
    for (size_t k = 0; k < kernel_runs.size(); ++k)
      if (kernel_runs[k] != 1) {
        at_ = p_.kernels[k].name;
        fail(fmt::format("is run by {} steps (expected one)", kernel_runs[k]));
      }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CompileError(fmt::format("loop IR verifier ({}): program '{}': {} {}. This is a bug in the loop stage; "
                                   "PROTEAN_LOGS=output_code prints the program",
                                   where_, p_.name, at_, what));
  }
  void buffer_in_range(int b) const {
    if (b < 0 || static_cast<size_t>(b) >= p_.buffers.size()) fail(fmt::format("names buffer b{} of {}", b, p_.buffers.size()));
  }

  /// Symbols an index of stage `r_` of a kernel with `k_` outer variables may use.
  void index(const sym::Expr& e, size_t K, size_t R, const char* what) const {
    if (!e) fail(fmt::format("has a missing {}", what));
    for (const sym::Expr& s : sym::free_symbols(e)) {
      bool ok = false;
      for (size_t i = 0; i < K && !ok; ++i) ok = s == outer_var(i);
      for (size_t i = 0; i < R && !ok; ++i) ok = s == inner_var(i);
      for (const sym::Expr& ps : p_.symbols) ok = ok || s == ps;
      if (!ok)
        fail(fmt::format("{} {} uses '{}', which is not an outer variable (x0..x{}), an inner variable (r0..r{}) or "
                         "a size symbol of the program",
                         what, sym::print(e), sym::print(s), static_cast<int>(K) - 1, static_cast<int>(R) - 1));
    }
  }

  void expr(const SExpr& e, size_t K, size_t R, const std::set<std::string>& locals, std::set<int>& loads) const {
    if (!e) fail("has a missing expression");
    auto args = [&](size_t n) {
      if (e->args.size() != n) fail(fmt::format("has a node '{}' with {} operands (expected {})", s_text(e), e->args.size(), n));
    };
    switch (e->op) {
      case SOp::Load: {
        args(0);
        buffer_in_range(e->buffer);
        const DType bt = p_.buffers[static_cast<size_t>(e->buffer)].dtype;
        if (bt != e->dtype) fail(fmt::format("loads b{} as {}, but the buffer holds {}", e->buffer, short_name(e->dtype), short_name(bt)));
        index(e->index, K, R, "load index");
        loads.insert(e->buffer);
        break;
      }
      case SOp::Const: args(0); break;
      case SOp::Index: args(0); index(e->index, K, R, "index value"); break;
      case SOp::Local:
        args(0);
        if (!locals.count(e->name)) fail(fmt::format("reads local '{}', which no earlier reduction stage of the kernel defines", e->name));
        break;
      case SOp::Cast: args(1); break;
      case SOp::Unary:
        args(1);
        if (scalar_arity(e->fn) != 1) fail(fmt::format("applies binary '{}' as a unary function", scalar_name(e->fn)));
        break;
      case SOp::Binary:
        args(2);
        if (scalar_arity(e->fn) != 2) fail(fmt::format("applies unary '{}' as a binary function", scalar_name(e->fn)));
        break;
      case SOp::Where:
        args(3);
        if (e->args[0]->dtype != DType::Bool) fail(fmt::format("selects on a {} condition", short_name(e->args[0]->dtype)));
        break;
      case SOp::Fma:
        args(3);
        if (e->dtype != DType::F32 && e->dtype != DType::F64) fail(fmt::format("has a {} fma (f32/f64 only)", short_name(e->dtype)));
        break;
    }
    for (const SExpr& a : e->args) expr(a, K, R, locals, loads);
  }

  /// Whether stage `i` of `k` reads buffer `b` only as a read-back: b is written once in the kernel, by
  /// an earlier pointwise stage over the same inner domain, and every load of b in stage i is at the
  /// element that stage stores (a producer fused into a row kernel, schedule.h).
  static bool read_back(const Kernel& k, size_t i, int b) {
    size_t writer = k.stages.size();
    int writes = 0;
    for (size_t j = 0; j < k.stages.size(); ++j) {
      const Stage& w = k.stages[j];
      for (int o : {w.out, w.out2, w.stash}) writes += o == b;
      if (w.out == b) writer = j;
    }
    if (writes != 1 || writer >= i) return false;
    const Stage& w = k.stages[writer];
    if (w.kind != StageKind::Pointwise || w.inner.empty() || w.inner != k.stages[i].inner) return false;
    bool ok = true;
    std::function<void(const SExpr&)> walk = [&](const SExpr& e) {
      if (e->op == SOp::Load && e->buffer == b && e->index != w.out_index) ok = false;
      for (const SExpr& a : e->args) walk(a);
    };
    walk(k.stages[i].body);
    return ok;
  }

  void kernel(const Kernel& k) {
    const size_t K = k.outer.size();
    std::set<std::string> locals;
    std::set<int> writes, stashes;
    for (size_t j = 0; j < k.stages.size(); ++j) {
      const Stage& s = k.stages[j];
      at_ = fmt::format("{} stage {}", k.name, j);
      const size_t R = s.inner.size();
      std::set<int> loads;
      expr(s.body, K, R, locals, loads);
      for (int b : loads) {
        if (written_[static_cast<size_t>(b)] && !writes.count(b)) continue;
        if (writes.count(b) && read_back(k, j, b)) continue;
        // a buffer this kernel writes (or nobody wrote yet): only a stash read back where this stage stores
        if (!(stashes.count(b) && s.kind == StageKind::Pointwise && s.out == b))
          fail(fmt::format("reads b{}, which {}", b, writes.count(b) ? "the kernel itself writes (no in-place update)" : "no earlier step writes"));
      }
      if (s.kind == StageKind::Pointwise) {
        if (s.out < 0) fail("is a pointwise stage without an output");
        if (!s.reduce_op.empty()) fail(fmt::format("is a pointwise stage with reduce_op '{}'", s.reduce_op));
        if (s.out2 >= 0 || s.stash >= 0) fail("is a pointwise stage with a second output or a stash");
      } else {
        if (s.reduce_op != "sum" && s.reduce_op != "prod" && s.reduce_op != "max" && s.reduce_op != "min" && s.reduce_op != "welford")
          fail(fmt::format("reduces with '{}' (sum, prod, max, min or welford)", s.reduce_op));
        if (s.local.empty()) fail("is a reduction without a local name");
        if (s.reduce_op == "welford" && s.local2.empty()) fail("is a welford reduction without its M2 local");
        if (s.reduce_op != "welford" && s.out2 >= 0) fail("stores a second result, which only welford has");
      }
      for (int b : {s.out, s.out2, s.stash}) {
        if (b < 0) continue;
        buffer_in_range(b);
        const BufferKind kind = p_.buffers[static_cast<size_t>(b)].kind;
        if (kind == BufferKind::Input || kind == BufferKind::Constant) fail(fmt::format("writes b{}, an input or constant", b));
        if (b != s.stash) index(s.out_index, K, R, "output index");
        writes.insert(b);
      }
      if (s.stash >= 0) {
        index(s.stash_index, K, R, "stash index");
        stashes.insert(s.stash);
      }
      if (s.kind == StageKind::Reduction) {
        locals.insert(s.local);
        if (!s.local2.empty()) locals.insert(s.local2);
      }
    }
    // a buffer a stage reads that a later stage of the kernel writes (other than the stash read-back)
    at_ = k.name;
    for (size_t j = 0; j < k.stages.size(); ++j) {
      const Stage& s = k.stages[j];
      std::set<int> loads;
      expr(s.body, K, s.inner.size(), all_locals(k), loads);
      for (int b : loads)
        if (writes.count(b) && !(stashes.count(b) && s.out == b) && !read_back(k, j, b))
          fail(fmt::format("reads b{}, which it also writes (no in-place update)", b));
    }
    for (int b : writes) written_[static_cast<size_t>(b)] = true;
    if (!k.schedule.target.empty()) schedule(k);
  }

  static std::set<std::string> all_locals(const Kernel& k) {
    std::set<std::string> r;
    for (const Stage& s : k.stages) {
      if (!s.local.empty()) r.insert(s.local);
      if (!s.local2.empty()) r.insert(s.local2);
    }
    return r;
  }

  void schedule(const Kernel& k) {
    const Schedule& sc = k.schedule;
    const size_t K = k.outer.size();
    at_ = fmt::format("{} ({} schedule)", k.name, sc.target);
    if (sc.stages.size() != k.stages.size()) fail(fmt::format("has {} stage schedules for {} stages", sc.stages.size(), k.stages.size()));
    if (sc.parallel_axes > K) fail(fmt::format("runs {} parallel axes over {} outer axes", sc.parallel_axes, K));
    if (sc.collapse > sc.parallel_axes) fail(fmt::format("collapses {} loops of {} parallel axes", sc.collapse, sc.parallel_axes));
    if (sc.parallel_inner && K > 0) fail("parallelizes inner loops of a kernel with an outer domain");
    if (sc.threads_per_row < 1 || sc.rows_per_block < 1) fail("has fewer than one thread per row or row per block");
    bool fused = true;
    for (const Stage& s : k.stages) fused &= s.kind == StageKind::Pointwise && s.inner.empty();
    if (sc.fused_pointwise && !fused) fail("is a fused pointwise schedule of a kernel with reductions or inner domains");
    if (sc.vector && (!sc.fused_pointwise || K == 0)) fail("vectorizes the outer loop of a kernel that is not a fused pointwise nest");
    if (sc.vector && sc.vector_width <= 0) fail("has a vector form without a vector width");
    if (sc.gpu_form != GpuForm::None) {
      if (sc.block_threads < 32 || sc.block_threads > 1024 || sc.block_threads % 32 != 0)
        fail(fmt::format("runs blocks of {} threads (a multiple of 32 up to 1024)", sc.block_threads));
      if (sc.gpu_form == GpuForm::GridStride && (!fused || K == 0)) fail("is a grid-stride schedule of a kernel that is not a fused pointwise nest");
      if ((sc.gpu_form == GpuForm::WarpPerRow || sc.gpu_form == GpuForm::BlockPerRow) && K == 0)
        fail("runs a row per warp or block for a kernel without an outer domain");
      if (sc.gpu_form == GpuForm::WarpPerRow && (sc.threads_per_row != 32 || sc.rows_per_block * 32 != sc.block_threads))
        fail(fmt::format("runs a warp per row with {} threads per row and {} rows in blocks of {}", sc.threads_per_row,
                         sc.rows_per_block, sc.block_threads));
      if (sc.rows_persist && sc.persist_chunks <= 0) fail("keeps rows in registers without a per-thread capacity");
    }
    for (size_t j = 0; j < k.stages.size(); ++j) {
      const Stage& s = k.stages[j];
      const StageSchedule& st = sc.stages[j];
      at_ = fmt::format("{} stage {} ({} schedule)", k.name, j, sc.target);
      const bool red = s.kind == StageKind::Reduction;
      switch (st.reduction) {
        case ReductionStrategy::None:
          if (red) fail(fmt::format("has no reduction strategy for a {} reduction", s.reduce_op));
          break;
        case ReductionStrategy::Serial:
        case ReductionStrategy::Warp:
        case ReductionStrategy::Block:
          if (!red) fail(fmt::format("has reduction strategy '{}' on a pointwise stage", strategy_name(st.reduction)));
          break;
        case ReductionStrategy::VectorMinMax:
          if (s.reduce_op != "max" && s.reduce_op != "min") fail(fmt::format("folds a {} reduction with vector max/min accumulators", s.reduce_op.empty() ? "pointwise" : s.reduce_op));
          break;
        case ReductionStrategy::Lanes:
          if (s.reduce_op != "sum" && s.reduce_op != "prod") fail(fmt::format("folds a {} reduction in accumulator lanes (sum/prod only)", s.reduce_op.empty() ? "pointwise" : s.reduce_op));
          if (s.inner.empty()) fail("folds accumulator lanes over no inner domain");
          break;
        case ReductionStrategy::Welford:
          if (s.reduce_op != "welford") fail(fmt::format("runs Welford's update for a {} stage", s.reduce_op.empty() ? "pointwise" : s.reduce_op));
          break;
      }
      const bool laned = st.reduction == ReductionStrategy::Lanes || st.reduction == ReductionStrategy::Welford ||
                         st.reduction == ReductionStrategy::VectorMinMax;
      if (laned && st.lanes <= 0) fail(fmt::format("has {} lanes", st.lanes));
      if (st.vector && sc.vector_width <= 0) fail("has a vector form without a vector width");
      if (st.vector && laned && st.lanes % sc.vector_width != 0) fail(fmt::format("has {} lanes, not a multiple of the vector width {}", st.lanes, sc.vector_width));
      if (st.vector && !sc.fused_pointwise && s.inner.empty()) fail("vectorizes a stage without an inner loop");
      if (st.vector && s.body->dtype != DType::F32) fail(fmt::format("vectorizes a {} body (the vector form holds f32)", short_name(s.body->dtype)));
      if (st.block < 0 || (st.block > 0 && (red || s.inner.empty()))) fail("runs blocks outside a pointwise stage with an inner domain");
      if (!st.prefetch.empty() && st.block == 0 && st.reduction != ReductionStrategy::Lanes && st.reduction != ReductionStrategy::Welford)
        fail("prefetches without a blocked loop");
      for (const PrefetchLoad& l : st.prefetch) {
        buffer_in_range(l.buffer);
        index(l.index, K, s.inner.size(), "prefetch index");
      }
    }
  }

  const Program& p_;
  std::string_view where_;
  std::string at_;
  std::vector<bool> written_;
};

}  // namespace

void verify(const Program& p, std::string_view where) { Verifier(p, where).run(); }

bool verify_enabled() {
#ifndef NDEBUG
  return true;
#else
  static const bool on = observe::env_opt_in("PROTEAN_LOOP_VERIFY");
  return on;
#endif
}

}  // namespace protean::loop
