#include "loop/schedule_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string_view>

#include "loop/vectorize.h"

namespace protean::loop {

namespace {

/// Accumulator lanes of the lanes form for `t` (accumulator_bytes / 4 for 4-byte types and
/// narrower, / 8 for 8-byte types).
int lanes_for(const CpuScheduleOptions& o, DType t) { return o.accumulator_bytes / (itemsize(t) >= 8 ? 8 : 4); }

/// True when a reduction's innermost loop uses the lanes form: sum and prod (max and min stay in the
/// `omp simd reduction` form, which compiles to the vector max/min instructions the lanes form cannot
/// express without fast-math), and not for constant extents below two blocks of lanes.
bool use_lanes(const CpuScheduleOptions& o, const Stage& s) {
  if (s.reduce_op != "sum" && s.reduce_op != "prod") return false;
  sym::Expr n = s.inner.back();
  return !n->is_integer() || n->value >= 2 * lanes_for(o, s.body->dtype);
}

/// True when the stage is rendered with blocks of values in its innermost loop (where prefetches go).
bool blocked_form(const CpuScheduleOptions& o, const Stage& s, size_t K) {
  if (s.inner.empty()) return false;
  if (s.kind == StageKind::Pointwise) return true;
  return s.reduce_op == "welford" || (K > 0 && use_lanes(o, s));
}

/// Next-row prefetch of a row kernel: the first stage streams the rows of this outer point from
/// memory, the later stages reread them from cache. The stage with the largest body among those over
/// the same inner domain (in a blocked form) prefetches the next outer point's rows of the first
/// stage's streaming loads, one hint per cache line per block, so that memory traffic overlaps compute.
/// Returns the stage (-1: none) and its loads.
std::pair<int, std::vector<PrefetchLoad>> plan_prefetch(const CpuScheduleOptions& o, const Program& p, const Kernel& k) {
  int stage = -1;
  std::vector<PrefetchLoad> loads;
  const size_t K = k.outer.size();
  if (K == 0 || k.stages.size() < 2 || k.stages[0].inner.empty()) return {stage, loads};
  const Stage& first = k.stages[0];
  const sym::Expr x = outer_var(K - 1), r = inner_var(first.inner.size() - 1);
  size_t best = 0;
  for (size_t j = 1; j < k.stages.size(); ++j) {
    const Stage& s = k.stages[j];
    if (s.inner != first.inner || !blocked_form(o, s, K)) continue;
    if (stage < 0 || s_size(s.body) > best) {
      stage = static_cast<int>(j);
      best = s_size(s.body);
    }
  }
  if (stage < 0) return {stage, loads};
  const size_t max_loads = static_cast<size_t>(o.max_prefetch_loads);
  std::function<void(const SExpr&)> walk = [&](const SExpr& e) {
    if (e->op == SOp::Load && loads.size() < max_loads) {
      auto fs = sym::free_symbols(e->index);
      bool streams = std::find(fs.begin(), fs.end(), x) != fs.end() && std::find(fs.begin(), fs.end(), r) != fs.end();
      sym::Expr next = simplify_index(sym::substitute(e->index, {{x, sym::add(x, sym::integer(1))}}));
      bool seen = false;
      for (const PrefetchLoad& l : loads) seen |= l.buffer == e->buffer && l.index == next;
      if (streams && !seen) loads.push_back({e->buffer, p.buffers[static_cast<size_t>(e->buffer)].dtype, next});
    }
    for (const auto& a : e->args) walk(a);
  };
  walk(first.body);
  if (loads.empty()) stage = -1;
  return {stage, loads};
}

}  // namespace

bool large_program(const Program& p) {
  size_t nodes = 0;
  for (const Kernel& k : p.kernels)
    for (const Stage& s : k.stages) {
      nodes += s_size(s.body);
      if (nodes > kLargeProgramNodes) return true;
    }
  return false;
}

CpuScheduleOptions CpuScheduleOptions::from_env() {
  static const bool vectorize = [] {
    const char* e = std::getenv("PROTEAN_CPU_VECTORIZE");
    return !(e && std::string_view(e) == "0");
  }();
  CpuScheduleOptions o;
  o.vectorize = vectorize;
  return o;
}

std::vector<Schedule> CpuSchedulePolicy::schedule(const Program& p) const {
  const bool large = large_program(p);
  std::vector<Schedule> out;
  out.reserve(p.kernels.size());
  // A large program keeps the vector form in its small kernels (at most kLargeProgramVectorKernelNodes
  // nodes each, kLargeProgramVectorNodes in all, in program order): a training step's many short
  // pointwise kernels (GELU and its derivative, the norm backwards) ran as scalar loops, while the deep
  // kernels of a long chain, what makes the vector form's compile time grow, stay scalar.
  size_t budget = kLargeProgramVectorNodes;
  for (const Kernel& k : p.kernels) {
    bool vector_form = o_.vectorize;
    if (large && vector_form) {
      size_t nodes = 0;
      for (const Stage& s : k.stages) nodes += s_size(s.body);
      vector_form = nodes <= kLargeProgramVectorKernelNodes && nodes <= budget;
      if (vector_form) budget -= nodes;
    }
    out.push_back(schedule_kernel(p, k, vector_form));
  }
  return out;
}

Schedule CpuSchedulePolicy::schedule_kernel(const Program& p, const Kernel& k, bool vector_form) const {
  Schedule sc;
  sc.work = kernel_work(k);
  sc.work_threshold = o_.work_threshold;
  if (vector_form) {
    sc.vector_width = o_.vector_width;
    sc.vector_bytes = o_.vector_width * 4;
  }
  const size_t K = k.outer.size();
  auto vector_ok = [&](const Stage& s, sym::Expr v) { return vector_form && vectorizable_stage(s, std::move(v)); };
  sc.stages.resize(k.stages.size());

  bool fused = true;
  for (const Stage& s : k.stages) fused &= s.kind == StageKind::Pointwise && s.inner.empty();
  if (fused) {
    // One loop nest over the outer domain; its innermost axis is the vector axis (when every stage has
    // the vector form), so it is parallel only when it is the only axis.
    sc.fused_pointwise = true;
    bool vec = K > 0;
    for (const Stage& s : k.stages) vec = vec && vector_ok(s, outer_var(K - 1));
    sc.vector = vec;
    if (K == 1) sc.parallel_axes = 1;
    else if (K > 1) sc.parallel_axes = sc.collapse = K - 1;
    for (StageSchedule& st : sc.stages) st.vector = vec;
    return sc;
  }

  if (K > 0) sc.parallel_axes = sc.collapse = K;
  else sc.parallel_inner = true;
  sc.rows_persist = K > 0 && k.stages.size() > 1;
  auto [prefetch_stage, prefetch] = plan_prefetch(o_, p, k);
  const int V = o_.vector_width;
  for (size_t j = 0; j < k.stages.size(); ++j) {
    const Stage& s = k.stages[j];
    StageSchedule& st = sc.stages[j];
    const size_t R = s.inner.size();
    const bool vok = R > 0 && vector_ok(s, inner_var(R - 1));
    if (static_cast<int>(j) == prefetch_stage) st.prefetch = prefetch;
    const bool red = s.kind == StageKind::Reduction;
    if (red && s.reduce_op == "welford") {
      st.reduction = ReductionStrategy::Welford;
      const int L = lanes_for(o_, s.body->dtype);
      st.vector = L == 4 * V && vok;
      st.lanes = st.vector ? o_.welford_vectors * V : L;
    } else if (red && K > 0 && R > 0 && use_lanes(o_, s)) {
      st.reduction = ReductionStrategy::Lanes;
      st.lanes = lanes_for(o_, s.body->dtype);
      st.vector = st.lanes == 4 * V && vok;
    } else if (!red && !st.prefetch.empty()) {
      st.block = o_.prefetch_block;
      st.vector = vok;
    } else if (red) {
      const bool minmax = is_floating(s.body->dtype) && (s.reduce_op == "max" || s.reduce_op == "min");
      if (vok && K > 0 && minmax) {
        st.reduction = ReductionStrategy::VectorMinMax;
        st.vector = true;
        st.lanes = 4 * V;
      } else {
        st.reduction = ReductionStrategy::Serial;
      }
    } else {
      // a pointwise stage whose only loop is the parallel one stays `parallel for simd`
      st.vector = vok && !(K == 0 && R == 1);
    }
  }
  return sc;
}

}  // namespace protean::loop
