#include "loop/schedule_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

namespace protean::loop {

namespace {

/// Elements of its row a thread keeps in registers at most; rows whose upper bound fits in 32 lanes x
/// the elements a thread keeps run one warp per row.
constexpr int64_t kPersistElems = 32;
/// Register bytes a thread spends on its part of the row (aligned variant: 16-byte vectors as
/// stored; 96 = 24 registers): bf16 layer_norm keeps 32 elements, bf16 softmax (row + f32 stash) 16.
constexpr int64_t kPersistBytes = 96;
/// Index math is 32-bit when every extent and buffer index stays below this.
constexpr int64_t kIndex32Limit = int64_t{1} << 30;

std::optional<int64_t> add_ub(std::optional<int64_t> a, std::optional<int64_t> b) {
  int64_t r;
  if (!a || !b || __builtin_add_overflow(*a, *b, &r)) return std::nullopt;
  return r;
}
std::optional<int64_t> mul_ub(std::optional<int64_t> a, std::optional<int64_t> b) {
  int64_t r;
  if (!a || !b || *a < 0 || *b < 0 || __builtin_mul_overflow(*a, *b, &r)) return std::nullopt;
  return r;
}

sym::Expr product(const std::vector<sym::Expr>& d) {
  sym::Expr n = sym::integer(1);
  for (const sym::Expr& e : d) n = sym::mul(n, e);
  return n;
}

/// Buffers a kernel loads or stores.
std::set<int> touched_buffers(const Kernel& k) {
  std::set<int> r;
  std::function<void(const SExpr&)> walk = [&](const SExpr& e) {
    if (e->op == SOp::Load) r.insert(e->buffer);
    for (const SExpr& a : e->args) walk(a);
  };
  for (const Stage& s : k.stages) {
    walk(s.body);
    for (int b : {s.out, s.out2, s.stash})
      if (b >= 0) r.insert(b);
  }
  return r;
}

/// Register bytes one element of a row takes when the row stays on chip: each load (buffer and
/// index) that two or more stages over the first stage's inner domain share, at its element size,
/// and each stashed reduction value at its compute type's size (f16/bf16 compute in f32). At least 1.
int64_t row_register_bytes(const Program& p, const Kernel& k) {
  if (k.stages.empty()) return 1;
  const std::vector<sym::Expr>& dom = k.stages[0].inner;
  std::set<int> written;
  for (const Stage& st : k.stages)
    for (int b : {st.out, st.out2, st.stash})
      if (b >= 0) written.insert(b);
  std::map<std::string, std::pair<int, int>> uses;  // load key -> (stages using it, buffer)
  int64_t bytes = 0;
  for (const Stage& st : k.stages) {
    if (st.inner != dom) continue;
    std::set<std::string> here;
    std::function<void(const SExpr&)> walk = [&](const SExpr& e) {
      if (e->op == SOp::Load && !written.count(e->buffer)) {
        const std::string key = fmt::format("{}@{}", e->buffer, s_text(e));
        if (here.insert(key).second) {
          auto& u = uses[key];
          ++u.first;
          u.second = e->buffer;
        }
      }
      for (const SExpr& a : e->args) walk(a);
    };
    walk(st.body);
    if (st.kind == StageKind::Reduction && st.stash >= 0) bytes += st.body->dtype == DType::F64 ? 8 : 4;
  }
  for (const auto& [key, u] : uses)
    if (u.first >= 2) bytes += static_cast<int64_t>(itemsize(p.buffers[static_cast<size_t>(u.second)].dtype));
  return std::max<int64_t>(bytes, 1);
}

int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 30)) p <<= 1;
  return p;
}

}  // namespace

std::optional<int64_t> upper_bound(const sym::Expr& e, const std::map<std::string, int64_t>& bounds) {
  using sym::Kind;
  switch (e->kind) {
    case Kind::Integer: return e->value;
    case Kind::Symbol: {
      auto it = bounds.find(e->name);
      if (it == bounds.end()) return std::nullopt;
      return it->second;
    }
    case Kind::Add: {
      std::optional<int64_t> r = 0;
      for (const sym::Expr& a : e->args) {
        // a negative term other than a constant decreases as its symbols grow: no bound from above
        if (!a->is_integer() && a->kind == Kind::Mul && !a->args.empty() && a->args[0]->is_integer() && a->args[0]->value < 0)
          return std::nullopt;
        r = add_ub(r, upper_bound(a, bounds));
      }
      return r;
    }
    case Kind::Mul: {
      std::optional<int64_t> r = 1;
      for (const sym::Expr& a : e->args) r = mul_ub(r, upper_bound(a, bounds));
      return r;
    }
    case Kind::FloorDiv:
    case Kind::CeilDiv: {
      const sym::Expr& d = e->args[1];
      if (!d->is_integer() || d->value <= 0) return std::nullopt;
      std::optional<int64_t> n = upper_bound(e->args[0], bounds);
      if (!n) return std::nullopt;
      return e->kind == Kind::FloorDiv ? *n / d->value : (*n + d->value - 1) / d->value;
    }
    case Kind::Mod: {
      const sym::Expr& d = e->args[1];
      if (d->is_integer() && d->value > 0) return d->value - 1;
      std::optional<int64_t> b = upper_bound(d, bounds);
      return b ? std::optional<int64_t>(*b - 1) : std::nullopt;
    }
    case Kind::Max: {
      std::optional<int64_t> r;
      for (const sym::Expr& a : e->args) {
        std::optional<int64_t> b = upper_bound(a, bounds);
        if (!b) return std::nullopt;
        r = r ? std::max(*r, *b) : *b;
      }
      return r;
    }
    case Kind::Min: {
      std::optional<int64_t> r;
      for (const sym::Expr& a : e->args)
        if (std::optional<int64_t> b = upper_bound(a, bounds)) r = r ? std::min(*r, *b) : *b;
      return r;
    }
    case Kind::Pow: {
      if (!e->args[1]->is_integer() || e->args[1]->value < 0) return std::nullopt;
      std::optional<int64_t> r = 1, b = upper_bound(e->args[0], bounds);
      for (int64_t i = 0; i < e->args[1]->value; ++i) r = mul_ub(r, b);
      return r;
    }
    case Kind::True:
    case Kind::False:
    case Kind::Eq:
    case Kind::Ne:
    case Kind::Lt:
    case Kind::Le:
    case Kind::Gt:
    case Kind::Ge:
    case Kind::And:
    case Kind::Or:
    case Kind::Not: return 1;
  }
  return std::nullopt;
}

std::vector<Schedule> CudaSchedulePolicy::schedule(const Program& p) const {
  const CudaScheduleOptions& o = o_;
  std::vector<Schedule> out;
  for (const Kernel& k : p.kernels) {
    Schedule s;
    bool pointwise = true;
    for (const Stage& st : k.stages) pointwise &= st.kind == StageKind::Pointwise && st.inner.empty();

    // vector width from the narrowest element (2 bytes or more) the kernel moves
    const std::set<int> bufs = touched_buffers(k);
    size_t narrow = 0;
    for (int b : bufs) {
      const size_t sz = itemsize(p.buffers[static_cast<size_t>(b)].dtype);
      if (sz >= 2 && (narrow == 0 || sz < narrow)) narrow = sz;
    }
    s.vector_width = narrow ? static_cast<int>(std::min<size_t>(8, 16 / narrow)) : 1;
    s.vector_bytes = narrow ? static_cast<int>(s.vector_width * narrow) : 0;

    // the longest inner domain (a row) and its upper bound
    std::optional<int64_t> row_ub = 1;
    sym::Expr row_len = sym::integer(1);
    for (const Stage& st : k.stages) {
      const sym::Expr n = product(st.inner);
      row_len = sym::maximum(row_len, n);
      std::optional<int64_t> b = upper_bound(n, o.upper_bounds);
      row_ub = b && row_ub ? std::optional<int64_t>(std::max(*row_ub, *b)) : std::nullopt;
    }

    // elements of the row a thread keeps: the register bytes one element of the row takes (each
    // load that several stages share, packed as stored, plus each stashed value in its compute
    // type) within kPersistBytes, a power of two from 4 to kPersistElems
    const int64_t per_elem = row_register_bytes(p, k);
    int64_t keep = kPersistElems;
    while (keep > 4 && keep * per_elem > kPersistBytes) keep >>= 1;

    if (pointwise && !k.outer.empty()) {
      s.gpu_form = GpuForm::GridStride;
      s.block_threads = 256;
      s.work = simplify_index(product(k.outer));
    } else if (k.outer.empty()) {
      s.gpu_form = GpuForm::SingleBlock;
      s.block_threads = 1024;
      s.threads_per_row = 1024;
      s.work = sym::integer(1);
    } else if (row_ub && *row_ub <= 32 * keep) {
      // a warp holds the whole row (at most `keep` elements per lane): warp_rows_per_block rows per block
      s.gpu_form = GpuForm::WarpPerRow;
      s.rows_per_block = o.warp_rows_per_block == 1 || o.warp_rows_per_block == 2 ? o.warp_rows_per_block : 4;
      s.block_threads = 32 * s.rows_per_block;
      s.threads_per_row = 32;
      s.work = simplify_index(product(k.outer));
    } else {
      // the fewest threads that hold the bounded row at `keep` elements each (a power of two, 64..1024);
      // unbounded rows stream through a block of 256
      s.gpu_form = GpuForm::BlockPerRow;
      s.block_threads = row_ub ? std::clamp(pow2_at_least((*row_ub + keep - 1) / keep), 64, 1024) : 256;
      s.threads_per_row = s.block_threads;
      s.work = simplify_index(product(k.outer));
    }
    if (s.gpu_form != GpuForm::GridStride && row_ub) {
      const int64_t chunks = (*row_ub + s.threads_per_row - 1) / s.threads_per_row;
      if (chunks <= keep && k.stages.size() > 1) {
        s.rows_persist = true;
        s.persist_chunks = static_cast<int>(std::max<int64_t>(chunks, 1));
      }
    }
    // row kernels: registers capped (in the aligned variant, whose row is packed) so that at least
    // CudaScheduleOptions::min_resident_threads (several rows) share a multiprocessor
    if (s.gpu_form == GpuForm::WarpPerRow || s.gpu_form == GpuForm::BlockPerRow)
      s.min_blocks = std::max(1, o.min_resident_threads / s.block_threads);
    if (s.gpu_form == GpuForm::GridStride) {
      s.fused_pointwise = true;
      s.parallel_axes = k.outer.size();
    } else if (s.gpu_form != GpuForm::SingleBlock) {
      s.parallel_axes = k.outer.size();
    }
    for (const Stage& st : k.stages) {
      StageSchedule ss;
      if (st.kind == StageKind::Reduction)
        ss.reduction = s.gpu_form == GpuForm::WarpPerRow ? ReductionStrategy::Warp : ReductionStrategy::Block;
      s.stages.push_back(ss);
    }

    // 32-bit index math when bounds prove every extent and buffer index fits
    bool fits = true;
    auto check = [&](const sym::Expr& e) {
      std::optional<int64_t> b = upper_bound(e, o.upper_bounds);
      fits = fits && b && *b < kIndex32Limit;
    };
    check(product(k.outer));
    check(row_len);
    std::optional<int64_t> total = mul_ub(upper_bound(product(k.outer), o.upper_bounds), row_ub);
    fits = fits && total && *total < kIndex32Limit;
    for (int b : bufs) check(product(p.buffers[static_cast<size_t>(b)].sizes));
    s.index32 = fits;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace protean::loop
