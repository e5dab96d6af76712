#include "loop/schedule.h"

#include "loop/vectorize.h"
#include "sym/simplify.h"
#include "sym/value_ranges.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

namespace protean::loop {

namespace {

void collect_loads(const SExpr& e, std::vector<const SNode*>& out) {
  if (e->op == SOp::Load) out.push_back(e.get());
  for (const auto& a : e->args) collect_loads(a, out);
}

/// `s` with the loop variables of its store's index and of its loads' and index values' renamed by `ren`.
Stage renamed(Stage s, const std::unordered_map<sym::Expr, sym::Expr>& ren) {
  s.out_index = simplify_index(sym::substitute(s.out_index, ren));
  s.body = s_rewrite(s.body, [&](const SExpr& e) -> SExpr {
    if (e->op != SOp::Load && e->op != SOp::Index) return nullptr;
    SNode n = *e;
    n.index = simplify_index(sym::substitute(e->index, ren));
    return std::make_shared<const SNode>(std::move(n));
  });
  return s;
}

/// Tries to merge `b` into `a`; returns false (and leaves both unchanged) when not allowed.
bool try_fuse(Kernel& a, const Kernel& b) {
  // B's leading dims are A's outer domain (softmax over [1, s, d] at batch 1: the max and the
  // normalization both run over [1, s]); failing that, A's outer dims of size 1, which carry no index,
  // may be missing from B (a reduction over [1, s] rows, then its consumer over [s, d] after a reshape
  // dropped the 1: LayerNorm before a projection), and B's leading dims match A's other dims in order.
  std::vector<size_t> keep;
  bool same_prefix = b.outer.size() >= a.outer.size() && !a.outer.empty();
  for (size_t i = 0; same_prefix && i < a.outer.size(); ++i) same_prefix = a.outer[i] == b.outer[i];
  for (size_t i = 0; i < a.outer.size(); ++i)
    if (same_prefix || !a.outer[i]->is_integer(1)) keep.push_back(i);
  const size_t k = keep.size();
  const bool unit_dims = k != a.outer.size();
  if (k == 0 || b.outer.size() < k) return false;
  for (size_t i = 0; i < k; ++i)
    if (a.outer[keep[i]] != b.outer[i]) return false;
  bool has_reduction = false;
  for (const Stage& s : a.stages) has_reduction |= s.kind == StageKind::Reduction;
  if (!has_reduction) return false;
  std::vector<Stage> stages = b.stages;
  if (b.outer.size() > k || unit_dims) {
    // B is a plain pointwise kernel over A's outer domain + more dims: those become its inner loop.
    if (b.stages.size() != 1 || b.stages[0].kind != StageKind::Pointwise || !b.stages[0].inner.empty()) return false;
    std::unordered_map<sym::Expr, sym::Expr> ren;
    for (size_t i = 0; i < k; ++i)
      if (keep[i] != i) ren[outer_var(i)] = outer_var(keep[i]);
    for (size_t j = k; j < b.outer.size(); ++j) ren[outer_var(j)] = inner_var(j - k);
    Stage s = renamed(b.stages[0], ren);
    s.inner.assign(b.outer.begin() + static_cast<int64_t>(k), b.outer.end());
    stages = {std::move(s)};
  }
  // Buffers A writes: reduction results (readable as locals at their out_index) and others (not readable).
  // A pointwise stage of A over an inner domain (a producer fused in by try_fuse_prologue) is readable
  // too, at the element of the same inner point, by a stage over the same inner domain: read back.
  std::map<int, std::pair<const Stage*, std::string>> red_out;  // buffer -> (stage, local)
  std::map<int, const Stage*> row_out;                         // buffer -> pointwise stage over the row
  std::set<int> other_out;
  for (const Stage& s : a.stages) {
    if (s.stash >= 0) other_out.insert(s.stash);
    if (s.kind == StageKind::Reduction) {
      if (s.out >= 0) red_out[s.out] = {&s, s.local};
      if (s.out2 >= 0) red_out[s.out2] = {&s, s.local2};
    } else if (s.out >= 0) {
      if (!s.inner.empty() && !row_out.count(s.out)) row_out[s.out] = &s;
      else other_out.insert(s.out);
    }
  }
  for (const Stage& s : stages) {
    std::vector<const SNode*> loads;
    collect_loads(s.body, loads);
    for (const SNode* l : loads) {
      if (other_out.count(l->buffer)) return false;
      if (auto rt = row_out.find(l->buffer); rt != row_out.end() &&
          (rt->second->inner != s.inner || rt->second->out_index != l->index))
        return false;
      auto it = red_out.find(l->buffer);
      if (it != red_out.end() && it->second.first->out_index != l->index) return false;
    }
  }
  for (Stage& s : stages) {
    s.body = s_rewrite(s.body, [&](const SExpr& e) -> SExpr {
      if (e->op != SOp::Load) return nullptr;
      auto it = red_out.find(e->buffer);
      if (it == red_out.end()) return nullptr;
      return s_local(it->second.second, e->dtype);
    });
    a.stages.push_back(std::move(s));
  }
  return true;
}

/// Pointwise producer into a row kernel (see schedule.h): `a` is one pointwise stage over [outer..., t...]
/// writing buffer P, `b` a row kernel over [outer...] whose stages read P only at the element their
/// inner point (over [t...]) names. `a`'s stage becomes b's first stage, over inner [t...]; b's stages
/// read back what it wrote (renderers order a row's stages: a GPU row synchronizes its threads after
/// a stage whose output a later stage reads). Returns false and leaves both unchanged when not allowed.
bool try_fuse_prologue(Kernel& a, const Kernel& b) {
  if (a.stages.size() != 1 || b.stages.empty()) return false;
  const Stage& pa = a.stages[0];
  const size_t k = b.outer.size();
  if (pa.kind != StageKind::Pointwise || !pa.inner.empty() || pa.out < 0 || pa.stash >= 0) return false;
  if (k == 0 || a.outer.size() <= k) return false;
  for (size_t i = 0; i < k; ++i)
    if (a.outer[i] != b.outer[i]) return false;
  const std::vector<sym::Expr> inner(a.outer.begin() + static_cast<int64_t>(k), a.outer.end());
  bool has_reduction = false;
  for (const Stage& st : b.stages) has_reduction |= st.kind == StageKind::Reduction;
  if (!has_reduction) return false;
  // a's stage with its trailing outer vars renamed to inner vars.
  std::unordered_map<sym::Expr, sym::Expr> ren;
  for (size_t j = k; j < a.outer.size(); ++j) ren[outer_var(j)] = inner_var(j - k);
  Stage first = renamed(pa, ren);
  first.inner = inner;
  // b may read P only at the element of its own inner point, in stages over the same inner domain,
  // and must not write what a reads or writes.
  std::vector<const SNode*> a_loads;
  collect_loads(pa.body, a_loads);
  std::set<int> a_reads;
  for (const SNode* l : a_loads) a_reads.insert(l->buffer);
  bool reads_p = false;
  for (const Stage& st : b.stages) {
    for (int o : {st.out, st.out2, st.stash})
      if (o >= 0 && (o == pa.out || a_reads.count(o))) return false;
    std::vector<const SNode*> loads;
    collect_loads(st.body, loads);
    for (const SNode* l : loads) {
      if (l->buffer != pa.out) continue;
      if (st.inner != inner || l->index != first.out_index) return false;
      reads_p = true;
    }
  }
  if (!reads_p) return false;
  std::vector<Stage> stages{first};
  stages.insert(stages.end(), b.stages.begin(), b.stages.end());
  a.outer = b.outer;
  a.stages = std::move(stages);
  return true;
}

bool has_call(const SExpr& e) {
  if (e->op == SOp::Unary && scalar_is_call(e->fn)) return true;
  for (const auto& a : e->args)
    if (has_call(a)) return true;
  return false;
}

/// Reduction-value reuse inside one kernel (see schedule.h); returns the number of stashes made.
int stash_reduction_values(const Program& p, Kernel& k) {
  int made = 0;
  for (size_t i = 0; i < k.stages.size(); ++i) {
    Stage& r = k.stages[i];
    if (r.kind != StageKind::Reduction || r.stash >= 0 || !has_call(r.body)) continue;
    const std::string key = s_text(r.body);
    for (size_t j = i + 1; j < k.stages.size(); ++j) {
      Stage& w = k.stages[j];
      if (w.kind != StageKind::Pointwise || w.out < 0 || w.inner != r.inner) continue;
      if (p.buffers[static_cast<size_t>(w.out)].dtype != r.body->dtype) continue;
      bool shared = false;  // another stage writes the buffer, or any stage reads it
      for (size_t m = 0; m < k.stages.size(); ++m) {
        const Stage& o = k.stages[m];
        shared |= (m != j && (o.out == w.out || o.out2 == w.out || o.stash == w.out));
        std::vector<const SNode*> loads;
        collect_loads(o.body, loads);
        for (const SNode* l : loads) shared |= l->buffer == w.out;
      }
      if (shared) continue;
      bool found = false;
      SExpr body = s_rewrite(w.body, [&](const SExpr& e) -> SExpr {
        if (e->dtype != r.body->dtype || s_text(e) != key) return nullptr;
        found = true;
        return s_load(w.out, e->dtype, w.out_index);
      });
      if (!found) continue;
      w.body = std::move(body);
      r.stash = w.out;
      r.stash_index = w.out_index;
      ++made;
      break;
    }
  }
  return made;
}

/// Buffers a step reads and writes.
struct Access {
  std::set<int> reads, writes;
  void add(const Access& o) {
    reads.insert(o.reads.begin(), o.reads.end());
    writes.insert(o.writes.begin(), o.writes.end());
  }
};
Access access(const Program& p, const Step& st) {
  Access a;
  if (!st.is_kernel) {
    const Extern& e = p.externs[static_cast<size_t>(st.index)];
    for (int b : e.inputs)
      if (b >= 0) a.reads.insert(b);
    a.writes.insert(e.outputs.begin(), e.outputs.end());
    return a;
  }
  for (const Stage& s : p.kernels[static_cast<size_t>(st.index)].stages) {
    std::vector<const SNode*> loads;
    collect_loads(s.body, loads);
    for (const SNode* l : loads) a.reads.insert(l->buffer);
    for (int o : {s.out, s.out2, s.stash})
      if (o >= 0) a.writes.insert(o);
  }
  return a;
}
bool intersects(const std::set<int>& x, const std::set<int>& y) {
  for (int v : x)
    if (y.count(v)) return true;
  return false;
}
/// No true, anti or output dependence between the two.
bool independent(const Access& x, const Access& y) {
  return !intersects(x.writes, y.reads) && !intersects(x.reads, y.writes) && !intersects(x.writes, y.writes);
}

/// Horizontal fusion (see schedule.h); returns the number of kernels merged away.
int horizontal_fusion(Program& p) {
  int merged = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (!p.steps[i].is_kernel) continue;
    Kernel& a = p.kernels[static_cast<size_t>(p.steps[i].index)];
    if (a.outer.empty()) continue;  // no outer loop to share: each stage parallelizes its own loop
    Access fused = access(p, p.steps[i]), between;
    for (size_t j = i + 1; j < p.steps.size();) {
      const Step& sj = p.steps[j];
      Access aj = access(p, sj);
      if (sj.is_kernel && p.kernels[static_cast<size_t>(sj.index)].outer == a.outer && independent(fused, aj) &&
          independent(between, aj)) {
        Kernel& b = p.kernels[static_cast<size_t>(sj.index)];
        for (Stage& s : b.stages) a.stages.push_back(std::move(s));
        b.stages.clear();
        fused.add(aj);
        p.steps.erase(p.steps.begin() + static_cast<int64_t>(j));
        ++merged;
        continue;
      }
      between.add(aj);
      ++j;
    }
  }
  return merged;
}

/// Renumbers kernels densely in step order (dropping kernels no step runs).
void renumber_kernels(Program& p) {
  std::vector<Kernel> kernels;
  for (Step& s : p.steps) {
    if (!s.is_kernel) continue;
    kernels.push_back(std::move(p.kernels[static_cast<size_t>(s.index)]));
    s.index = static_cast<int>(kernels.size() - 1);
    kernels.back().name = "kernel" + std::to_string(s.index);
  }
  p.kernels = std::move(kernels);
}

/// Static element count of `b`, or -1 when a size is symbolic.
int64_t static_numel(const Buffer& b) {
  int64_t n = 1;
  for (const sym::Expr& s : b.sizes) {
    if (!s->is_integer()) return -1;
    n *= s->value;
  }
  return n;
}

/// A stage `load(bE, r0) -> bC[r0 + c]` over [n] in a kernel without outer loops: {bE, c, n}, else
/// {-1, 0, 0}. c and n are constants.
struct WholeCopy {
  int from = -1;
  int64_t offset = 0, n = 0;
};
WholeCopy whole_copy(const Program& p, const Kernel& k, const Stage& s) {
  if (!k.outer.empty() || s.kind != StageKind::Pointwise || s.inner.size() != 1 || !s.inner[0]->is_integer() ||
      s.out < 0 || s.out2 >= 0 || s.stash >= 0 || s.body->op != SOp::Load || s.body->index != inner_var(0))
    return {};
  const sym::Expr c = simplify_index(sym::sub(s.out_index, inner_var(0)));
  if (!c->is_integer() || c->value < 0) return {};
  const Buffer& from = p.buffers[static_cast<size_t>(s.body->buffer)];
  if (from.dtype != p.buffers[static_cast<size_t>(s.out)].dtype || s.body->dtype != from.dtype) return {};
  return {s.body->buffer, c->value, s.inner[0]->value};
}

/// Extern results in place of their copies (see schedule.h); returns how many were placed. Only
/// externs with one result: places are matched to an op's allocations by dtype and element count, so
/// two results of one size could land in each other's place, which a copy-in would then overwrite.
int extern_results_into_copies(Program& p, const std::function<bool(const Extern&)>& placeable) {
  const size_t nb = p.buffers.size();
  std::vector<int> reads(nb, 0), writer_extern(nb, -1), kernel_writers(nb, 0), extern_writers(nb, 0);
  for (const Step& s : p.steps) {
    const Access a = access(p, s);
    if (s.is_kernel) {
      for (const Stage& stg : p.kernels[static_cast<size_t>(s.index)].stages) {
        std::vector<const SNode*> loads;
        collect_loads(stg.body, loads);
        for (const SNode* l : loads) ++reads[static_cast<size_t>(l->buffer)];
      }
      for (int b : a.writes) ++kernel_writers[static_cast<size_t>(b)];
    } else {
      const Extern& e = p.externs[static_cast<size_t>(s.index)];
      for (int b : e.inputs)
        if (b >= 0) ++reads[static_cast<size_t>(b)];
      for (int b : e.outputs) {
        ++extern_writers[static_cast<size_t>(b)];
        writer_extern[static_cast<size_t>(b)] = s.index;
      }
    }
  }
  for (int o : p.outputs) ++reads[static_cast<size_t>(o)];
  int placed = 0;
  for (Kernel& k : p.kernels) {
    // The destinations whose every write is a whole copy of this kernel, over disjoint ranges, and
    // which this kernel does not read.
    std::map<int, std::vector<std::pair<int64_t, int64_t>>> ranges;  // destination → [offset, offset + n)
    std::set<int> refused, read_here;
    for (const Stage& s : k.stages) {
      std::vector<const SNode*> loads;
      collect_loads(s.body, loads);
      for (const SNode* l : loads) read_here.insert(l->buffer);
      for (int o : {s.out2, s.stash})
        if (o >= 0) refused.insert(o);
      if (s.out < 0) continue;
      const WholeCopy w = whole_copy(p, k, s);
      if (w.from < 0) refused.insert(s.out);
      else ranges[s.out].push_back({w.offset, w.offset + w.n});
    }
    std::set<int> ok;
    for (auto& [dst, rs] : ranges) {
      const Buffer& d = p.buffers[static_cast<size_t>(dst)];
      const int64_t numel = static_numel(d);
      if (refused.count(dst) || read_here.count(dst) || d.kind != BufferKind::Temp || d.from_extern || d.alias >= 0 ||
          numel < 0 || kernel_writers[static_cast<size_t>(dst)] != 1 || extern_writers[static_cast<size_t>(dst)] != 0)
        continue;
      std::sort(rs.begin(), rs.end());
      bool disjoint = rs.back().second <= numel;
      for (size_t i = 1; i < rs.size() && disjoint; ++i) disjoint = rs[i - 1].second <= rs[i].first;
      if (disjoint) ok.insert(dst);
    }
    std::vector<Stage> kept;
    for (Stage& s : k.stages) {
      const WholeCopy w = s.out >= 0 && ok.count(s.out) ? whole_copy(p, k, s) : WholeCopy{};
      Buffer* from = w.from >= 0 ? &p.buffers[static_cast<size_t>(w.from)] : nullptr;
      const int e = from ? writer_extern[static_cast<size_t>(w.from)] : -1;
      if (from && from->kind == BufferKind::Temp && from->from_extern && from->alias < 0 &&
          reads[static_cast<size_t>(w.from)] == 1 && extern_writers[static_cast<size_t>(w.from)] == 1 && e >= 0 &&
          static_numel(*from) == w.n && p.externs[static_cast<size_t>(e)].outputs.size() == 1 &&
          placeable(p.externs[static_cast<size_t>(e)])) {
        from->alias = s.out;
        from->alias_offset = w.offset;
        ++placed;
        continue;
      }
      kept.push_back(std::move(s));
    }
    k.stages = std::move(kept);
  }
  if (placed == 0) return 0;
  std::vector<Step> steps;  // kernels left without stages run nothing
  for (const Step& s : p.steps)
    if (!s.is_kernel || !p.kernels[static_cast<size_t>(s.index)].stages.empty()) steps.push_back(s);
  p.steps = std::move(steps);
  renumber_kernels(p);
  return placed;
}

/// True for an operation whose result can jump when its argument moves by one unit in the last
/// place: floor(2.99999976) is 2 where floor(3) is 3, so a division under it must stay a division.
bool rounding_sensitive(const SNode& e) {
  switch (e.op) {
    case SOp::Cast: return !is_floating(e.dtype);
    case SOp::Unary:
      return e.fn == ScalarOp::floor || e.fn == ScalarOp::ceil || e.fn == ScalarOp::round || e.fn == ScalarOp::sign;
    case SOp::Binary:  // comparisons are not: see reciprocal_divisions
    case SOp::Load:
    case SOp::Const:
    case SOp::Index:
    case SOp::Local:
    case SOp::Where:
    case SOp::Fma: return false;
  }
  return false;
}

/// Collects every node below a rounding-sensitive operation (each node visited once per state).
void collect_exact(const SExpr& e, bool under, std::set<std::pair<const SNode*, bool>>& seen,
                   std::set<const SNode*>& exact) {
  if (!seen.insert({e.get(), under}).second) return;
  if (under) exact.insert(e.get());
  const bool below = under || rounding_sensitive(*e);
  for (const auto& a : e->args) collect_exact(a, below, seen, exact);
}

/// True when `d` is a float constant whose reciprocal is an exact power of two (x * (1/d) == x / d).
bool power_of_two_constant(const SNode& d) {
  if (d.op != SOp::Const || !is_floating(d.dtype) || d.fval == 0 || !std::isfinite(d.fval)) return false;
  int e = 0;
  const double m = std::frexp(std::fabs(d.fval), &e);
  return m == 0.5 && e > -125 && e < 126;  // 1/d is a normal f32 (and f64) number
}

/// Float divisions by a constant become multiplications by its reciprocal; returns the number
/// rewritten. A division below an operation that rounds to an integer (floor, ceil, round, sign, a
/// cast to an integer or bool: remainder, floor division, quantization) stays a division unless the
/// constant is a power of two, where the two are equal. Nothing else about where the division sits
/// decides: a value several kernels compute (the partitioner recomputes in the backward) must have the
/// same bits in each. Keeping divisions exact under comparisons and max/min gave x/5 in one kernel and
/// x·0.2 in another (1 ulp apart), and amax's backward, eq(x, amax(x)), lost the maximum's row; so did
/// rewriting a computed divisor where it is loop-invariant (x / (|m| + 1), m per row, is invariant
/// along a row and not down a column).
int reciprocal_divisions(Kernel& k) {
  int made = 0;
  for (Stage& s : k.stages) {
    if (s.inner.empty() && k.outer.empty()) continue;  // no loop to take the division out of
    std::set<std::pair<const SNode*, bool>> seen;
    std::set<const SNode*> exact;
    collect_exact(s.body, false, seen, exact);
    s.body = s_rewrite(s.body, [&](const SExpr& e) -> SExpr {
      if (e->op != SOp::Binary || e->fn != ScalarOp::div || !is_floating(e->dtype)) return nullptr;
      const SExpr& d = e->args[1];
      if (d->op != SOp::Const) return nullptr;  // a computed divisor is invariant in some kernels only
      if (exact.count(e.get()) && !power_of_two_constant(*d)) return nullptr;
      const SExpr r = e->dtype == DType::F32 ? s_const(1.0f / static_cast<float>(d->fval), DType::F32)
                                             : s_const(1.0 / d->fval, e->dtype);
      ++made;
      return s_binary(ScalarOp::mul, e->args[0], r, e->dtype);
    });
  }
  return made;
}

}  // namespace

ScheduleStats schedule_program(Program& p, const ScheduleOptions& options) {
  ScheduleStats st;
  st.kernels_before = static_cast<int>(p.kernels.size());
  // ---- row fusion -------------------------------------------------------------------------------
  std::vector<Step> steps;
  for (const Step& s : p.steps) {
    if (s.is_kernel && !steps.empty() && steps.back().is_kernel &&
        (try_fuse(p.kernels[static_cast<size_t>(steps.back().index)], p.kernels[static_cast<size_t>(s.index)]) ||
         try_fuse_prologue(p.kernels[static_cast<size_t>(steps.back().index)], p.kernels[static_cast<size_t>(s.index)])))
      continue;
    steps.push_back(s);
  }
  p.steps = std::move(steps);
  renumber_kernels(p);

  // ---- horizontal fusion ------------------------------------------------------------------------
  st.horizontal_fusions = horizontal_fusion(p);
  renumber_kernels(p);

  // ---- extern results in place of their copies ----------------------------------------------------
  if (options.extern_output_slot && options.extern_results_into_copies) {
    st.extern_results_into_copies = extern_results_into_copies(p, options.extern_output_slot);
    renumber_kernels(p);
  }
  st.kernels_after = static_cast<int>(p.kernels.size());

  // ---- reduction-value reuse --------------------------------------------------------------------
  for (Kernel& k : p.kernels) st.stashed_reductions += stash_reduction_values(p, k);

  // ---- invariant divisions → reciprocal multiplications -------------------------------------------
  for (Kernel& k : p.kernels) st.reciprocal_divisions += reciprocal_divisions(k);

  // ---- reads per buffer; drop stores nobody reads ------------------------------------------------
  const size_t nb = p.buffers.size();
  std::vector<int> last_use(nb, -1), first_def(nb, -1), reads(nb, 0);
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const Step& s = p.steps[si];
    if (s.is_kernel) {
      for (const Stage& stg : p.kernels[static_cast<size_t>(s.index)].stages) {
        std::vector<const SNode*> loads;
        collect_loads(stg.body, loads);
        for (const SNode* l : loads) {
          ++reads[static_cast<size_t>(l->buffer)];
          last_use[static_cast<size_t>(l->buffer)] = static_cast<int>(si);
        }
      }
    } else {
      for (int b : p.externs[static_cast<size_t>(s.index)].inputs)
        if (b >= 0) {
          ++reads[static_cast<size_t>(b)];
          last_use[static_cast<size_t>(b)] = static_cast<int>(si);
        }
    }
  }
  for (int o : p.outputs) ++reads[static_cast<size_t>(o)];
  auto unread = [&](int b) {
    return b >= 0 && reads[static_cast<size_t>(b)] == 0 && p.buffers[static_cast<size_t>(b)].kind == BufferKind::Temp;
  };
  for (Kernel& k : p.kernels)
    for (Stage& s : k.stages) {
      if (s.kind != StageKind::Reduction) continue;
      if (unread(s.out)) {
        s.out = -1;
        ++st.reductions_to_locals;
      }
      if (unread(s.out2)) {
        s.out2 = -1;
        ++st.reductions_to_locals;
      }
    }
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const Step& s = p.steps[si];
    if (s.is_kernel) {
      for (const Stage& stg : p.kernels[static_cast<size_t>(s.index)].stages)
        for (int o : {stg.out, stg.out2})
          if (o >= 0 && first_def[static_cast<size_t>(o)] < 0) first_def[static_cast<size_t>(o)] = static_cast<int>(si);
    } else {
      for (int b : p.externs[static_cast<size_t>(s.index)].outputs) {
        first_def[static_cast<size_t>(b)] = static_cast<int>(si);
        // an extern result written into another buffer: that buffer is live from here
        if (const int a = p.buffers[static_cast<size_t>(b)].alias; a >= 0 && first_def[static_cast<size_t>(a)] < 0)
          first_def[static_cast<size_t>(a)] = static_cast<int>(si);
      }
    }
  }

  // ---- buffer planning: greedy slot assignment by lifetime, best fit by size ------------------------
  // A slot is as large as the largest buffer it ever holds, so a buffer goes into the free slot that
  // fits it most tightly (the smallest one at least its size, else the largest one, which grows the
  // least). Sizes are compared with every symbol at a nominal 256: a planning estimate, never a guard,
  // under which a [B, H, T, T] buffer ranks above a [B, T, C] one, so length-squared buffers do not
  // spread over slots that length-sized buffers also use.
  auto nominal_bytes = [&](const Buffer& buf) {
    double n = static_cast<double>(itemsize(buf.dtype));
    for (const sym::Expr& d : buf.sizes) {
      int64_t v = 1;
      try {
        v = sym::evaluate(d, [](sym::Expr) -> int64_t { return 256; });
      } catch (const std::exception&) {
        v = 1;
      }
      n *= static_cast<double>(std::max<int64_t>(v, 0));
    }
    return n;
  };
  struct Slot {
    int free_after;
    double bytes;
  };
  std::vector<Slot> slots;
  std::vector<int> order;
  // Extern results that may share slots (ScheduleOptions::extern_output_slot): written by an extern
  // the backend accepts and read by no extern it does not (one that may return a view of its input).
  std::vector<bool> extern_slot(nb, false);
  if (options.extern_output_slot) {
    for (const Extern& e : p.externs)
      if (options.extern_output_slot(e))
        for (int b : e.outputs) extern_slot[static_cast<size_t>(b)] = true;
    for (const Extern& e : p.externs)
      if (!options.extern_output_slot(e))
        for (int b : e.inputs)
          if (b >= 0) extern_slot[static_cast<size_t>(b)] = false;
  }
  for (size_t b = 0; b < nb; ++b) {
    Buffer& buf = p.buffers[b];
    buf.slot = -1;
    if (buf.kind != BufferKind::Temp || (buf.from_extern && !extern_slot[b]) || buf.alias >= 0 || first_def[b] < 0) continue;
    order.push_back(static_cast<int>(b));
  }
  std::sort(order.begin(), order.end(), [&](int x, int y) { return first_def[static_cast<size_t>(x)] < first_def[static_cast<size_t>(y)]; });
  for (int b : order) {
    Buffer& buf = p.buffers[static_cast<size_t>(b)];
    int end = std::max(last_use[static_cast<size_t>(b)], first_def[static_cast<size_t>(b)]);
    const double need = nominal_bytes(buf);
    int fit = -1, largest = -1;  // the tightest free slot that fits; the largest free slot
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].free_after >= first_def[static_cast<size_t>(b)]) continue;
      const int si = static_cast<int>(s);
      if (slots[s].bytes >= need && (fit < 0 || slots[s].bytes < slots[static_cast<size_t>(fit)].bytes)) fit = si;
      if (largest < 0 || slots[s].bytes > slots[static_cast<size_t>(largest)].bytes) largest = si;
    }
    int chosen = fit >= 0 ? fit : largest;
    if (chosen < 0) {
      chosen = static_cast<int>(slots.size());
      slots.push_back({-1, 0.0});
    }
    slots[static_cast<size_t>(chosen)].free_after = end;
    slots[static_cast<size_t>(chosen)].bytes = std::max(slots[static_cast<size_t>(chosen)].bytes, need);
    buf.slot = chosen;
    ++st.temp_buffers;
    if (buf.from_extern) ++st.extern_slot_buffers;
  }
  p.num_slots = static_cast<int>(slots.size());
  st.slots = p.num_slots;

  // ---- releases ---------------------------------------------------------------------------------
  for (Step& s : p.steps) s.release.clear();
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = p.buffers[b];
    if (buf.kind != BufferKind::Temp || first_def[b] < 0) continue;
    int at = std::max(last_use[b], first_def[b]);
    p.steps[static_cast<size_t>(at)].release.push_back(static_cast<int>(b));
  }
  return st;
}

namespace {

/// Every index expression of `k` (stage < 0) or of stage `stage` alone, and the variables that appear
/// in index(...) values (never merged).
void collect_indices(const Kernel& k, int stage, std::vector<sym::Expr>& idx, std::set<sym::Expr>& pinned) {
  std::function<void(const SExpr&)> walk = [&](const SExpr& e) {
    if (e->op == SOp::Load) idx.push_back(e->index);
    if (e->op == SOp::Index)
      for (const sym::Expr& v : sym::free_symbols(e->index)) pinned.insert(v);
    for (const SExpr& a : e->args) walk(a);
  };
  for (size_t si = 0; si < k.stages.size(); ++si) {
    if (stage >= 0 && static_cast<int>(si) != stage) continue;
    const Stage& st = k.stages[si];
    walk(st.body);
    if (st.out_index) idx.push_back(st.out_index);
    if (st.stash_index) idx.push_back(st.stash_index);
  }
}

/// Whether vars a, b (b's extent nb) enter every expression affinely with coef(a) == nb * coef(b).
bool mergeable(const std::vector<sym::Expr>& idx, const sym::Expr& a, const sym::Expr& b, const sym::Expr& nb) {
  for (const sym::Expr& f : idx) {
    auto at = [&](int64_t va, int64_t vb) {
      return simplify_index(sym::substitute(f, {{a, sym::integer(va)}, {b, sym::integer(vb)}}));
    };
    const sym::Expr base = at(0, 0);
    const sym::Expr ca = simplify_index(sym::sub(at(1, 0), base)), cb = simplify_index(sym::sub(at(0, 1), base));
    for (const sym::Expr& c : {ca, cb})
      for (const sym::Expr& v : sym::free_symbols(c))
        if (v == a || v == b) return false;
    // affine: f == base + ca*a + cb*b, and a's step is nb of b's
    const sym::Expr rebuilt = simplify_index(sym::add(sym::add(base, sym::mul(ca, a)), sym::mul(cb, b)));
    if (rebuilt != simplify_index(f)) return false;
    if (simplify_index(sym::sub(ca, sym::mul(nb, cb))) != sym::integer(0)) return false;
  }
  return true;
}

/// Rewrites every load, index value, store and stash index of `k` (stage < 0) or of one stage with
/// `sub`, simplified with `ranges` (null: simplify_index's, every variable non-negative).
void substitute_indices(Kernel& k, int stage, const std::unordered_map<sym::Expr, sym::Expr>& sub,
                        const sym::RangeAnalyzer* ranges = nullptr) {
  auto fix = [&](const sym::Expr& e) {
    return ranges ? sym::simplify(sym::substitute(e, sub), ranges) : simplify_index(sym::substitute(e, sub));
  };
  for (size_t si = 0; si < k.stages.size(); ++si) {
    if (stage >= 0 && static_cast<int>(si) != stage) continue;
    Stage& st = k.stages[si];
    st.body = s_rewrite(st.body, [&](const SExpr& n) -> SExpr {
      if (n->op == SOp::Load) return s_load(n->buffer, n->dtype, fix(n->index));
      if (n->op == SOp::Index) return s_index(fix(n->index), n->dtype);
      return nullptr;
    });
    if (st.out_index) st.out_index = fix(st.out_index);
    if (st.stash_index) st.stash_index = fix(st.stash_index);
  }
}

/// Merges dims of `dims` (vars var(0), var(1), ...) while some adjacent pair merges; returns merges.
int merge_dims(Kernel& k, int stage, std::vector<sym::Expr>& dims, sym::Expr (*var)(size_t)) {
  int merges = 0;
  for (bool again = true; again;) {
    again = false;
    std::vector<sym::Expr> idx;
    std::set<sym::Expr> pinned;
    collect_indices(k, stage, idx, pinned);
    for (size_t d = dims.size(); d-- > 1;) {
      const sym::Expr a = var(d - 1), b = var(d);
      if (pinned.count(a) || pinned.count(b) || !mergeable(idx, a, b, dims[d])) continue;
      // a*nb + b becomes the merged var (named a); later vars shift down by one
      std::unordered_map<sym::Expr, sym::Expr> sub{{a, sym::integer(0)}, {b, a}};
      for (size_t j = d + 1; j < dims.size(); ++j) sub[var(j)] = var(j - 1);
      substitute_indices(k, stage, sub);
      dims[d - 1] = simplify_index(sym::mul(dims[d - 1], dims[d]));
      dims.erase(dims.begin() + static_cast<long>(d));
      ++merges;
      again = true;
      break;
    }
  }
  return merges;
}

/// The constant divisors c of every x / c and x % c in `e` whose dividend mentions x; `other` is set
/// when x appears in a division by something else.
void divisors_of(const sym::Expr& e, const sym::Expr& x, std::set<int64_t>& found, bool& other) {
  if ((e->kind == sym::Kind::FloorDiv || e->kind == sym::Kind::Mod || e->kind == sym::Kind::CeilDiv) &&
      sym::has_symbol(e->args[0], x)) {
    if (e->kind != sym::Kind::CeilDiv && e->args[1]->is_integer() && e->args[1]->value > 0) found.insert(e->args[1]->value);
    else other = true;
  }
  for (const sym::Expr& a : e->args) divisors_of(a, x, found, other);
}

bool split_kernel(Kernel& k, int64_t min_inner) {
  const size_t K = k.outer.size();
  if (K == 0 || !k.outer.back()->is_integer()) return false;
  for (const Stage& s : k.stages)
    if (s.kind != StageKind::Pointwise || !s.inner.empty()) return false;
  const int64_t N = k.outer.back()->value;
  const sym::Expr x = outer_var(K - 1), lo = outer_var(K);
  std::vector<sym::Expr> idx;
  std::set<sym::Expr> pinned;
  collect_indices(k, -1, idx, pinned);
  std::set<int64_t> found;
  bool other = false;
  for (const sym::Expr& e : idx) divisors_of(e, x, found, other);
  for (const Stage& s : k.stages)  // conditions on the index (a cat's select) count too
    s_rewrite(s.body, [&](const SExpr& n) -> SExpr {
      if (n->op == SOp::Index) divisors_of(n->index, x, found, other);
      return nullptr;
    });
  if (other || found.size() != 1) return false;
  const int64_t c = *found.begin();
  if (c < min_inner || c >= N || N % c != 0) return false;
  bool before = true;
  for (const Stage& s : k.stages) before = before && vectorizable_stage(s, x);
  if (before) return false;
  Kernel split = k;
  sym::RangeAnalyzer ra(sym::ValueRange{0, sym::kIntOo});
  ra.set_symbol_range(lo, sym::ValueRange{0, c - 1});
  ra.set_symbol_range(x, sym::ValueRange{0, N / c - 1});
  substitute_indices(split, -1, {{x, sym::add(sym::mul(sym::integer(c), x), lo)}}, &ra);
  split.outer.back() = sym::integer(N / c);
  split.outer.push_back(sym::integer(c));
  for (const Stage& s : split.stages)
    if (!vectorizable_stage(s, lo)) return false;
  k = std::move(split);
  return true;
}

}  // namespace

int split_divided_dims(Program& p, int64_t min_inner) {
  int splits = 0;
  for (Kernel& k : p.kernels) splits += split_kernel(k, min_inner) ? 1 : 0;
  return splits;
}

int merge_contiguous_dims(Program& p) {
  int merges = 0;
  for (Kernel& k : p.kernels) {
    merges += merge_dims(k, -1, k.outer, &outer_var);
    for (size_t si = 0; si < k.stages.size(); ++si) merges += merge_dims(k, static_cast<int>(si), k.stages[si].inner, &inner_var);
  }
  return merges;
}

}  // namespace protean::loop
