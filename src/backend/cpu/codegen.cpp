// The cpu renderer: loop nests, OpenMP pragmas, the explicit 16-lane vector forms and the
// reduction forms, on top of the shared C-style expression renderer (loop/c_expr.h). The helpers the
// kernels call are the runtime header src/backend/cpu/runtime/prelude.h, embedded at build time.
#include "backend/cpu/codegen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

#include "loop/c_expr.h"
#include "loop/vectorize.h"
#include "protean/error.h"
#include "sym/printer.h"

namespace protean::backend::cpu {

using namespace loop;  // the IR this file renders

namespace {

// kTailNote. The scalar loop after a vector loop (fewer than a vector's values) is emitted without
// `#pragma omp simd`. GCC 12 at -O2/-O3 vectorized such tails whose selects read memory in their arms
// (`c ? b20[i] : b13[i] * ...`, the gradients of minimum, amax and where) into masked loads at the
// wrong address: one row further on, and past the buffer on the last row (wrong gradients, garbage).
// The vector loop loads both arms itself and selects (pt::vsel), and a tail is too short to gain
// from vectorization (a max or min reduction's tail gives the same value in any order).
// AutogradCompiled.GradientKernelReadsItsOwnRowBesideAPrefetch reproduced it; LoopSchedule.
// CpuPolicyRowKernel checks that no tail carries the pragma. Whole scalar loops (stages without a
// vector form, or PROTEAN_CPU_VECTORIZE=0) keep `omp simd`; GCC's loop if-conversion, which made the
// masked loads, is off for generated code (-fno-tree-loop-if-convert, toolchain.cpp).

/// The cpu renderer's C dialect: the runtime header's functions live in namespace pt, fused
/// multiply-adds are GCC builtins, limits come from the header's pt::numeric_limits.
constexpr CDialect kCpu{};

const char* ctype(DType t) { return c_type(t); }
std::string cidx(const sym::Expr& e) { return c_index(e, kCpu); }

/// The form of each scalar function on the runtime header's 16-lane vectors (pt::vf values, pt::vm
/// masks for bool; {a}, {b}: the operands, {ns}: pt::). The cpu renderer's one table beside the shared
/// scalar one (loop/c_expr.h); no `default:`, so -Wswitch names a new ScalarOp here too.
const char* vector_form(ScalarOp f) {
  using S = ScalarOp;
  switch (f) {
    case S::abs: return "{ns}v_abs({a})";
    case S::neg: return "{ns}v_neg({a})";
    case S::logical_not: return "(~{a})";
    case S::exp: return "{ns}v_exp({a})";
    case S::log: return "{ns}v_log({a})";
    case S::sqrt: return "{ns}v_sqrt({a})";
    case S::rsqrt: return "{ns}v_rsqrt({a})";
    case S::reciprocal: return "{ns}v_reciprocal({a})";
    case S::sin: return "{ns}v_sin({a})";
    case S::cos: return "{ns}v_cos({a})";
    case S::tanh: return "{ns}v_tanh({a})";
    case S::erf: return "{ns}v_erf({a})";
    case S::normal_cdf: return "{ns}v_normal_cdf({a})";
    case S::sigmoid: return "{ns}v_sigmoid({a})";
    case S::ceil: return "{ns}v_ceil({a})";
    case S::floor: return "{ns}v_floor({a})";
    case S::round: return "{ns}v_round({a})";
    case S::relu: return "{ns}v_relu({a})";
    case S::sign: return "{ns}v_sign({a})";
    case S::add: return "({a} + {b})";
    case S::sub: return "({a} - {b})";
    case S::mul: return "({a} * {b})";
    case S::div: return "({a} / {b})";
    case S::max: return "{ns}vmaxn({a}, {b})";
    case S::min: return "{ns}vminn({a}, {b})";
    case S::pow: return "{ns}v_powf_({a}, {b})";
    case S::eq: return "({a} == {b})";
    case S::ne: return "({a} != {b})";
    case S::lt: return "({a} < {b})";
    case S::le: return "({a} <= {b})";
    case S::gt: return "({a} > {b})";
    case S::ge: return "({a} >= {b})";
    case S::logical_and: return "({a} & {b})";
    case S::logical_or: return "({a} | {b})";
  }
  return "0 /* unknown scalar op */";
}

/// `text` n times, comma-separated (an initializer list).
std::string repeat(const std::string& text, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += (i ? ", " : "") + text;
  return r;
}

/// The `if (work >= N)` clause of a parallel pragma (none when the schedule has no threshold).
std::string parallel_if(const Schedule& sc) {
  return sc.work_threshold > 0 ? fmt::format(" if (work >= {})", sc.work_threshold) : std::string();
}

/// The shared C-style body emitter (loop/c_expr.h) in the cpu dialect.
class BodyEmitter : public CBodyEmitter {
 public:
  BodyEmitter(std::string indent, int& counter, std::string& out) : CBodyEmitter(kCpu, std::move(indent), counter, out) {}
};

/// The explicit vector form of a loop body over innermost variable `v` (16 consecutive values of v per
/// step): a value that depends on v through a load is a pt::vf (f32) or pt::vm (mask, for bool), every
/// other value stays a scalar emitted by BodyEmitter and is broadcast where a vector needs it.
/// `supported` says whether a body has this form: its varying values are f32 or bool, its varying
/// loads are unit-stride f32 loads, and no select would execute a load its condition guards against
/// (cat / pad: a varying load under a condition on the index, or under a condition that does not vary).
class VecBodyEmitter {
 public:
  VecBodyEmitter(sym::Expr v, std::string indent, int& counter, std::string& out)
      : va_(std::move(v)), indent_(indent), counter_(counter), out_(out), scalar_(std::move(indent), counter, out) {}

  /// True when `e` depends on the vector variable through a load (or an index).
  bool varying(const SExpr& e) { return va_.varying(e); }

  /// Emits `e` and returns its name: a vector when it varies, else a scalar.
  std::string emit(const SExpr& e) {
    if (!varying(e)) return scalar_.emit(e);
    // under a select on the index, loads are masked: the key names the mask
    std::string key = s_text(e) + ":" + std::string(short_name(e->dtype)) + (guard_.empty() ? "" : "?" + guard_);
    if (auto it = names_.find(key); it != names_.end()) return it->second;
    std::string expr;
    switch (e->op) {
      case SOp::Load:
        expr = guard_.empty() ? fmt::format("pt::vld(&b{}[{}])", e->buffer, cidx(e->index))
                              : fmt::format("pt::vldm(&b{}[{}], {})", e->buffer, cidx(e->index), guard_);
        break;
      case SOp::Cast:
        if (e->dtype == DType::Bool && e->args[0]->op == SOp::Index) expr = mask(e->args[0]->index);
        else expr = e->dtype == DType::Bool ? fmt::format("({} != 0.0f)", vec(e->args[0])) : fmt::format("pt::vof({})", vec(e->args[0]));
        break;
      case SOp::Unary: expr = c_fill(vector_form(e->fn), {vec(e->args[0])}, "pt::vf", kCpu); break;
      case SOp::Binary: {
        const std::string a = vec(e->args[0]), b = vec(e->args[1]);
        expr = c_fill(vector_form(e->fn), {a, b}, "pt::vf", kCpu);
        break;
      }
      // operands are named in order (function arguments' evaluation order is unspecified)
      case SOp::Fma: {
        const std::string a = vec(e->args[0]), b = vec(e->args[1]), c = vec(e->args[2]);
        expr = fmt::format("pt::vfma({}, {}, {})", a, b, c);
        break;
      }
      case SOp::Where: {
        const std::string c = varying(e->args[0]) ? vec(e->args[0]) : emit(e->args[0]);
        std::string a, b;
        if (varying(e->args[0]) && has_index_cond(e->args[0])) {
          // a condition on the index may guard the branches' loads: each branch reads only its lanes
          const std::string outer = guard_;
          const std::string not_c = fmt::format("t{}", counter_++);
          out_ += fmt::format("{}const pt::vm {} = ~{};\n", indent_, not_c, c);
          guard_ = outer.empty() ? c : and_mask(outer, c);
          a = vec(e->args[1]);
          guard_ = outer.empty() ? not_c : and_mask(outer, not_c);
          b = vec(e->args[2]);
          guard_ = outer;
        } else {
          a = vec(e->args[1]);
          b = vec(e->args[2]);
        }
        expr = varying(e->args[0]) ? fmt::format("pt::vsel({}, {}, {})", c, a, b) : fmt::format("({} ? {} : {})", c, a, b);
        break;
      }
      case SOp::Index:
      case SOp::Const:
      case SOp::Local: return "/* not a vector */ 0";
    }
    std::string name = fmt::format("t{}", counter_++);
    out_ += fmt::format("{}const pt::{} {} = {};\n", indent_, e->dtype == DType::Bool ? "vm" : "vf", name, expr);
    names_[key] = name;
    return name;
  }

  /// `e` as a vector (a scalar is broadcast).
  /// From now on the scalar `e` is `name` (computed before the loop: hoist_invariants).
  void bind(const SExpr& e, const std::string& name) { scalar_.bind(e, name); }

  std::string vec(const SExpr& e) {
    if (varying(e)) return emit(e);
    return fmt::format("pt::vb{}({})", e->dtype == DType::Bool ? "m" : "f", scalar_.emit(e));
  }

 private:
  static bool has_index_cond(const SExpr& e) {
    if (e->op == SOp::Index) return true;
    for (const auto& a : e->args)
      if (has_index_cond(a)) return true;
    return false;
  }
  /// A named mask `a & b` (the guard of a select nested in another's branch).
  std::string and_mask(const std::string& a, const std::string& b) {
    std::string name = fmt::format("t{}", counter_++);
    out_ += fmt::format("{}const pt::vm {} = {} & {};\n", indent_, name, a, b);
    return name;
  }
  /// The vector mask of a condition on the index (vectorize.h vector_mask): each relation compares
  /// the difference of its sides, computed at the first lane and advanced by its lane step, with 0.
  std::string mask(const sym::Expr& c) {
    using sym::Kind;
    auto rel = [&](const char* op) {
      sym::Expr d = simplify_index(sym::sub(c->args[0], c->args[1]));
      const int64_t step = lane_step(d, va_.var()).value();
      return fmt::format("(pt::vlin({}, {}) {} 0)", cidx(d), step, op);
    };
    switch (c->kind) {
      case Kind::Eq: return rel("==");
      case Kind::Ne: return rel("!=");
      case Kind::Lt: return rel("<");
      case Kind::Le: return rel("<=");
      case Kind::Gt: return rel(">");
      case Kind::Ge: return rel(">=");
      case Kind::And:
      case Kind::Or: {
        std::string r;
        for (size_t i = 0; i < c->args.size(); ++i) r += (i ? (c->kind == Kind::And ? " & " : " | ") : "") + mask(c->args[i]);
        return "(" + r + ")";
      }
      case Kind::Not: return "(~" + mask(c->args[0]) + ")";
      case Kind::True: return "pt::vbm(true)";
      case Kind::False: return "pt::vbm(false)";
      case Kind::Integer: case Kind::Symbol: case Kind::Add: case Kind::Mul: case Kind::Pow:
      case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
        break;
    }
    throw CompileError(fmt::format("cpu codegen: index condition {} has no vector mask form", sym::print(c)));
  }

  std::string guard_;  ///< the mask of the lanes the enclosing selects take ("" = every lane)
  VaryingAnalysis va_;
  std::string indent_;
  int& counter_;
  std::string& out_;
  BodyEmitter scalar_;
  std::unordered_map<std::string, std::string> names_;
};

void collect(const SExpr& e, std::set<int>& loads, std::set<std::string>& syms) {
  if (e->op == SOp::Load || e->op == SOp::Index)
    for (auto s : sym::free_symbols(e->index)) syms.insert(s->name);
  if (e->op == SOp::Load) loads.insert(e->buffer);
  for (const auto& a : e->args) collect(a, loads, syms);
}
void collect_syms(sym::Expr e, std::set<std::string>& syms) {
  for (auto s : sym::free_symbols(e)) syms.insert(s->name);
}

const char* omp_red(const std::string& op) {
  if (op == "sum") return "+";
  if (op == "prod") return "*";
  if (op == "max") return "max";
  return "min";
}
std::string red_init(const std::string& op, DType t) {
  const char* c = ctype(t);
  if (op == "sum") return fmt::format("{}(0)", c);
  if (op == "prod") return fmt::format("{}(1)", c);
  if (t == DType::Bool) return op == "max" ? "false" : "true";
  if (is_floating(t))
    return fmt::format("{}pt::numeric_limits<{}>::infinity()", op == "max" ? "-" : "", c);
  return fmt::format("pt::numeric_limits<{}>::{}()", c, op == "max" ? "lowest" : "max");
}

std::string loop(const std::string& ind, const std::string& var, sym::Expr n) {
  return fmt::format("{}for (int64_t {} = 0; {} < {}; ++{}) {{\n", ind, var, var, cidx(n), var);
}

/// `a + v` or `a * v` (the lanes form's sum / prod step).
std::string combine(const std::string& op, const std::string& a, const std::string& v) {
  return fmt::format("{} {} {}", a, op == "prod" ? "*" : "+", v);
}

/// `pt::vst(&b<out>[index], v)`, or pt::vst_stream under the kernel's `pt_stream` for the buffers in
/// `streamed` (codegen.h: stream_store_min_bytes).
std::string vector_store(const std::set<int>& streamed, int out, const std::string& index, const std::string& v) {
  if (streamed.count(out)) return fmt::format("pt::vst_stream(&b{}[{}], {}, pt_stream)", out, index, v);
  return fmt::format("pt::vst(&b{}[{}], {})", out, index, v);
}

/// Emits the code of one stage of a kernel at indentation `ind` (inside the outer loops), in the form
/// its StageSchedule names.
class StageEmitter {
 public:
  /// `streamed`: the kernel's outputs written with pt::vst_stream (emit_kernel).
  StageEmitter(const Kernel& k, size_t stage, int& counter, std::string& out, const std::set<int>& streamed)
      : k_(k), s_(k.stages[stage]), sc_(k.schedule), st_(k.schedule.stages[stage]), counter_(counter), out_(out),
        K_(k.outer.size()), R_(s_.inner.size()), V_(sc_.vector_width), prefetch_(st_.prefetch), streamed_(streamed) {}

  void emit(const std::string& ind) {
    switch (st_.reduction) {
      case ReductionStrategy::None: return st_.block > 0 ? blocked_pointwise(ind) : plain(ind);
      case ReductionStrategy::Serial:
      case ReductionStrategy::VectorMinMax: return plain(ind);
      case ReductionStrategy::Lanes: return lanes(ind);
      case ReductionStrategy::Welford: return welford(ind);
      case ReductionStrategy::Warp:
      case ReductionStrategy::Block: break;
    }
    throw CompileError(fmt::format("cpu codegen: {} stage of {} has reduction strategy '{}', which the cpu renderer "
                                   "does not implement (schedule it with the cpu policy, loop/schedule_cpu.h)",
                                   s_.reduce_op.empty() ? "a pointwise" : "a " + s_.reduce_op, k_.name,
                                   strategy_name(st_.reduction)));
  }

 private:
  /// Prefetch hints for the block of values starting at innermost index `block` (a C variable):
  /// one per cache line of each prefetched load, covering `count` values.
  void emit_prefetch(const std::string& ind, const std::string& block, int count) {
    std::unordered_map<sym::Expr, sym::Expr> at;
    for (const PrefetchLoad& l : prefetch_) {
      const int step = 64 / static_cast<int>(itemsize(l.dtype));
      for (int off = 0; off < count; off += step) {
        at[inner_var(R_ - 1)] = sym::add(sym::symbol(block), sym::integer(off));
        out_ += fmt::format("{}pt::prefetch(b{}, {});\n", ind, l.buffer, cidx(simplify_index(sym::substitute(l.index, at))));
      }
    }
  }

  /// A pointwise stage whose innermost loop runs in blocks of 64 values, each block preceded by
  /// prefetches of the next outer iteration's rows.
  void blocked_pointwise(const std::string& ind) {
    const std::string rv = var(R_ - 1), nm = fmt::format("{}_b", rv);
    out_ += ind + "{\n";
    std::string i1 = open_outer_inner(ind + "  ");
    out_ += fmt::format("{}const int64_t {}_n = {};\n", i1, rv, n(R_ - 1));
    const int B = st_.block;
    out_ += fmt::format("{}for (int64_t {} = 0; {} < {}_n; {} += {}) {{\n", i1, nm, nm, rv, nm, B);
    emit_prefetch(i1 + "  ", nm, B);
    out_ += fmt::format("{}  const int64_t {}_e = {} + {} < {}_n ? {} + {} : {}_n;\n", i1, rv, nm, B, rv, nm, B, rv);
    std::string first = nm;
    if (vector_ok()) {
      out_ += fmt::format("{}  const int64_t {}_v = {} + ({}_e - {}) / {} * {};\n", i1, rv, nm, rv, nm, V_, V_);
      out_ += fmt::format("{}  for (int64_t {} = {}; {} < {}_v; {} += {}) {{\n", i1, rv, nm, rv, rv, rv, V_);
      std::string v = vvalue(i1 + "    ");
      out_ += fmt::format("{}    {};\n{}  }}\n", i1, vstore(s_.out, cidx(s_.out_index), v), i1);
      first = rv + "_v";
    }
    // the scalar tail (fewer than a vector's values) without `omp simd`: see kTailNote
    if (!vector_ok()) out_ += fmt::format("{}  #pragma omp simd\n", i1);
    out_ += fmt::format("{}  for (int64_t {} = {}; {} < {}_e; ++{}) {{\n", i1, rv, first, rv, rv, rv);
    std::string v = value(i1 + "    ");
    out_ += fmt::format("{}    b{}[{}] = {};\n{}  }}\n{}}}\n", i1, s_.out, cidx(s_.out_index), v, i1, i1);
    close_outer_inner(i1);
    out_ += ind + "}\n";
  }

  std::string var(size_t i) const { return inner_var(i)->name; }
  std::string n(size_t i) const { return cidx(s_.inner[i]); }
  const char* ty() const { return ctype(s_.body->dtype); }

  /// Opens the loops over inner dims [0, R-1) (no pragmas); returns the new indentation.
  std::string open_outer_inner(std::string ind) {
    for (size_t i = 0; i + 1 < R_; ++i) {
      out_ += loop(ind, var(i), s_.inner[i]);
      ind += "  ";
    }
    return ind;
  }
  std::string close_outer_inner(std::string ind) {
    for (size_t i = 0; i + 1 < R_; ++i) {
      ind.resize(ind.size() - 2);
      out_ += ind + "}\n";
    }
    return ind;
  }
  /// The body's value at the current point (temporaries emitted at `ind`), plus the stash store.
  std::string value(const std::string& ind, bool stash = true) {
    BodyEmitter em(ind, counter_, out_);
    std::string v = em.emit(s_.body);
    if (stash && s_.stash >= 0) out_ += fmt::format("{}b{}[{}] = {};\n", ind, s_.stash, cidx(s_.stash_index), v);
    return v;
  }

  /// The body's value as a vector of 16 values starting at the innermost index (temporaries emitted at
  /// `ind`), plus the stash store.
  std::string vvalue(const std::string& ind, bool stash = true) {
    VecBodyEmitter em(inner_var(R_ - 1), ind, counter_, out_);
    std::string v = em.vec(s_.body);
    if (stash && s_.stash >= 0) out_ += fmt::format("{}pt::vst(&b{}[{}], {});\n", ind, s_.stash, cidx(s_.stash_index), v);
    return v;
  }
  bool vector_ok() const { return st_.vector; }
  /// The vector store of `v` into element `index` of buffer `out` (a streamed output: pt::vst_stream).
  std::string vstore(int out, const std::string& index, const std::string& v) const {
    return vector_store(streamed_, out, index, v);
  }
  /// The comparison a max/min reduction keeps the new value by ("<" for min).
  const char* minmax_cmp() const { return s_.reduce_op == "max" ? ">" : "<"; }

  /// Pointwise stages, and reductions in the one-accumulator `omp simd reduction` form. The innermost
  /// loop takes the explicit vector form (16 values per step, then a scalar tail) for pointwise stages
  /// whose innermost loop is not the parallel one, and for f32 max/min inside an outer loop (four
  /// vector accumulators and a NaN mask, folded into the scalar accumulator at the end).
  void plain(const std::string& ind) {
    const bool red = s_.kind == StageKind::Reduction;
    const DType t = s_.body->dtype;
    const bool nanflag = red && is_floating(t) && (s_.reduce_op == "max" || s_.reduce_op == "min");
    const bool vec = st_.vector;
    const int nv = vec && red ? st_.lanes / V_ : 0;  // vector accumulators of VectorMinMax
    const std::string& acc = s_.local;
    const char* cmp = minmax_cmp();
    if (red) {
      out_ += fmt::format("{}{} {} = {};\n", ind, ty(), acc, red_init(s_.reduce_op, t));
      if (nanflag) out_ += fmt::format("{}int {}_nan = 0;\n", ind, acc);
    }
    std::string ind2 = ind;
    out_ += ind2 + "{\n";
    ind2 += "  ";
    if (vec && red) {
      const std::string init = fmt::format("pt::vbf({})", red_init(s_.reduce_op, t));
      out_ += fmt::format("{}pt::vf {}_va[{}] = {{{}}};\n{}pt::vm {}_vn = pt::vm{{}};\n", ind2, acc, nv, repeat(init, nv), ind2, acc);
    }
    const size_t scalar_loops = vec ? R_ - 1 : R_;
    for (size_t i = 0; i < scalar_loops; ++i) {
      std::string clauses;
      if (red) {
        clauses = fmt::format(" reduction({}:{})", omp_red(s_.reduce_op), acc);
        if (nanflag) clauses += fmt::format(" reduction(|:{}_nan)", acc);
      }
      // the parallel loop of a kernel without outer domain; `simd` too when it is the innermost loop
      if (sc_.parallel_inner && i == 0 && R_ == 1) out_ += fmt::format("#pragma omp parallel for simd{}{}\n", clauses, parallel_if(sc_));
      else if (sc_.parallel_inner && i == 0) out_ += fmt::format("#pragma omp parallel for{}{}\n", clauses, parallel_if(sc_));
      else if (i + 1 == R_) out_ += fmt::format("{}#pragma omp simd{}\n", ind2, clauses);
      out_ += loop(ind2, var(i), s_.inner[i]);
      ind2 += "  ";
    }
    if (vec) {
      const std::string rv = var(R_ - 1), nn = n(R_ - 1);
      out_ += fmt::format("{}const int64_t {}_v = {} - {} % {};\n", ind2, rv, nn, nn, V_);
      if (red) {
        // full blocks of lanes values over the nv accumulators, then blocks of one vector into the first
        out_ += fmt::format("{}const int64_t {}_f = {} - {} % {};\n", ind2, rv, nn, nn, nv * V_);
        out_ += fmt::format("{}for (int64_t {}_b = 0; {}_b < {}_f; {}_b += {}) {{\n", ind2, rv, rv, rv, rv, nv * V_);
        out_ += fmt::format("{}  #pragma GCC unroll {}\n", ind2, nv);
        out_ += fmt::format("{}  for (int64_t {}_j = 0; {}_j < {}; ++{}_j) {{\n", ind2, rv, rv, nv, rv);
        out_ += fmt::format("{}    const int64_t {} = {}_b + {} * {}_j;\n", ind2, rv, rv, V_, rv);
        vector_minmax_step(ind2 + "    ", fmt::format("{}_va[{}_j]", acc, rv));
        out_ += ind2 + "  }\n" + ind2 + "}\n";
        out_ += fmt::format("{}for (int64_t {} = {}_f; {} < {}_v; {} += {}) {{\n", ind2, rv, rv, rv, rv, rv, V_);
        vector_minmax_step(ind2 + "  ", acc + "_va[0]");
        out_ += ind2 + "}\n";
        // the scalar tail without `omp simd` (kTailNote); a max or min in any order is the same value
      } else {
        out_ += fmt::format("{}for (int64_t {} = 0; {} < {}_v; {} += {}) {{\n", ind2, rv, rv, rv, rv, V_);
        std::string v = vvalue(ind2 + "  ");
        out_ += fmt::format("{}  {};\n{}}}\n", ind2, vstore(s_.out, cidx(s_.out_index), v), ind2);
        // the scalar tail without `omp simd`: see kTailNote
      }
      out_ += fmt::format("{}for (int64_t {} = {}_v; {} < {}; ++{}) {{\n", ind2, rv, rv, rv, nn, rv);
      ind2 += "  ";
    }
    std::string v = value(ind2);
    if (red) {
      if (s_.reduce_op == "sum") out_ += fmt::format("{}{} += {};\n", ind2, acc, v);
      else if (s_.reduce_op == "prod") out_ += fmt::format("{}{} *= {};\n", ind2, acc, v);
      else {
        out_ += fmt::format("{}{} = {} {} {} ? {} : {};\n", ind2, acc, v, cmp, acc, v, acc);
        if (nanflag) out_ += fmt::format("{}{}_nan |= {} != {};\n", ind2, acc, v, v);
      }
    } else {
      out_ += fmt::format("{}b{}[{}] = {};\n", ind2, s_.out, cidx(s_.out_index), v);
    }
    for (size_t i = R_; i-- > 0;) {
      ind2.resize(ind2.size() - 2);
      out_ += ind2 + "}\n";
    }
    if (vec && red) {
      // the accumulators never hold NaN (a NaN never wins the comparison; the mask records it): fold
      // the four vectors, then the 16 lanes
      out_ += fmt::format("{0}for (int j = 1; j < {3}; ++j) {1}_va[0] = {1}_va[j] {2} {1}_va[0] ? {1}_va[j] : {1}_va[0];\n", ind2, acc, cmp, nv);
      out_ += fmt::format("{}for (int l = 0; l < {}; ++l) {{\n", ind2, V_);
      out_ += fmt::format("{0}  {1} = {1}_va[0][l] {2} {1} ? {1}_va[0][l] : {1};\n{0}  {1}_nan |= {1}_vn[l];\n{0}}}\n", ind2, acc, cmp);
    }
    ind2.resize(ind2.size() - 2);
    out_ += ind2 + "}\n";
    if (red) {
      if (nanflag) out_ += fmt::format("{}if ({}_nan) {} = pt::numeric_limits<{}>::quiet_NaN();\n", ind, acc, acc, ty());
      store_results(ind);
    }
  }

  /// One step of the vector max/min: folds the body's 16 values at the current index into `lane`.
  void vector_minmax_step(const std::string& ind, const std::string& lane) {
    std::string v = vvalue(ind);
    out_ += fmt::format("{}{} = {} {} {} ? {} : {};\n", ind, lane, v, minmax_cmp(), lane, v, lane);
    out_ += fmt::format("{}{}_vn |= {} != {};\n", ind, s_.local, v, v);
  }

  void store_results(const std::string& ind) {
    if (s_.out >= 0) out_ += fmt::format("{}b{}[{}] = {};\n", ind, s_.out, cidx(s_.out_index), s_.local);
    if (s_.out2 >= 0) out_ += fmt::format("{}b{}[{}] = {};\n", ind, s_.out2, cidx(s_.out_index), s_.local2);
  }

  /// Opens the block loop of the lanes and welford forms at `ind` (inside the loops over the other inner
  /// dims): full blocks of L values of the innermost index, `first` (if any) at the top of each block,
  /// the prefetch hints, then the loop over the block's values `<acc>_i` (one value per lane, or one
  /// vector of 16 lanes per step in the vector form), with the innermost variable defined. Returns the
  /// indentation of the body; the caller closes both loops.
  std::string open_lane_blocks(const std::string& ind, int L, bool vec, const std::string& first) {
    const std::string& acc = s_.local;
    out_ += fmt::format("{}const int64_t {}_n = {};\n", ind, acc, n(R_ - 1));
    out_ += fmt::format("{}const int64_t {}_full = {}_n - {}_n % {};\n", ind, acc, acc, acc, L);
    out_ += fmt::format("{}for (int64_t {}_b = 0; {}_b < {}_full; {}_b += {}) {{\n", ind, acc, acc, acc, acc, L);
    if (!first.empty()) out_ += fmt::format("{}  {}\n", ind, first);
    emit_prefetch(ind + "  ", acc + "_b", L);
    if (vec) {
      out_ += fmt::format("{}  #pragma GCC unroll {}\n", ind, L / V_);
      out_ += fmt::format("{}  for (int64_t {}_i = 0; {}_i < {}; {}_i += {}) {{\n", ind, acc, acc, L, acc, V_);
    } else {
      out_ += fmt::format("{}  #pragma omp simd\n", ind);
      out_ += fmt::format("{}  for (int64_t {}_i = 0; {}_i < {}; ++{}_i) {{\n", ind, acc, acc, L, acc);
    }
    out_ += fmt::format("{}    const int64_t {} = {}_b + {}_i;\n", ind, var(R_ - 1), acc, acc);
    return ind + "    ";
  }

  /// sum/prod with L accumulator lanes: the innermost loop runs in blocks of L values, value i of a
  /// block folding into lane i, then the tail into lanes 0.., and the lanes are folded pairwise at
  /// the end. Several independent vector accumulators hide the add latency that bounds a
  /// one-accumulator reduction.
  void lanes(const std::string& ind) {
    const DType t = s_.body->dtype;
    const std::string& acc = s_.local;
    const std::string& op = s_.reduce_op;
    const int L = st_.lanes;
    const std::string rv = var(R_ - 1);
    out_ += fmt::format("{}{} {} = {};\n", ind, ty(), acc, red_init(op, t));
    out_ += ind + "{\n";
    std::string i1 = ind + "  ";
    out_ += fmt::format("{}{} {}_l[{}];\n", i1, ty(), acc, L);
    out_ += fmt::format("{}#pragma omp simd\n{}for (int64_t l = 0; l < {}; ++l) {}_l[l] = {};\n", i1, i1, L, acc, red_init(op, t));
    const bool vec = st_.vector;
    const int nv = vec ? L / V_ : 0;  // accumulator vectors
    if (vec) {
      const std::string init = fmt::format("pt::vbf({})", red_init(op, t));
      out_ += fmt::format("{}pt::vf {}_vl[{}] = {{{}}};\n", i1, acc, nv, repeat(init, nv));
    }
    std::string i2 = open_outer_inner(i1);
    const std::string i3 = open_lane_blocks(i2, L, vec, "");
    if (vec) {
      std::string lane = fmt::format("{}_vl[{}_i / {}]", acc, acc, V_);
      std::string v = vvalue(i3);
      out_ += fmt::format("{}{} = {};\n", i3, lane, combine(op, lane, v));
    } else {
      std::string v = value(i3);
      std::string lane = fmt::format("{}_l[{}_i]", acc, acc);
      out_ += fmt::format("{}{} = {};\n", i3, lane, combine(op, lane, v));
    }
    out_ += i2 + "  }\n" + i2 + "}\n";
    out_ += fmt::format("{}#pragma omp simd\n", i2);
    out_ += fmt::format("{}for (int64_t {} = {}_full; {} < {}_n; ++{}) {{\n", i2, rv, acc, rv, acc, rv);
    const std::string tv = value(i2 + "  ");
    const std::string tlane = fmt::format("{}_l[{} - {}_full]", acc, rv, acc);
    out_ += fmt::format("{}  {} = {};\n", i2, tlane, combine(op, tlane, tv));
    out_ += i2 + "}\n";
    close_outer_inner(i2);
    if (vec)
      out_ += fmt::format("{}for (int j = 0; j < {}; ++j) pt::vst({}_l + {} * j, {});\n", i1, nv, acc, V_,
                          combine(op, fmt::format("pt::vld({}_l + {} * j)", acc, V_), acc + "_vl[j]"));
    for (int w = L / 2; w > 0; w /= 2)  // constant trip counts: the compiler keeps the lanes in registers
      out_ += fmt::format("{}#pragma omp simd\n{}for (int64_t l = 0; l < {}; ++l) {}_l[l] = {};\n", i1, i1, w, acc,
                          combine(op, acc + "_l[l]", fmt::format("{}_l[l + {}]", acc, w)));
    out_ += fmt::format("{}{} = {}_l[0];\n", i1, acc, acc);
    out_ += ind + "}\n";
    store_results(ind);
  }

  /// Welford mean/M2 (see loop_ir.h). L lanes each run Welford's update on every L-th value of the
  /// full blocks (all lanes see the same count, so one reciprocal per block serves them all); the
  /// tail of each innermost run is reduced exactly in two passes and merged into a side accumulator;
  /// at the end the lanes (equal counts) and the side accumulator are merged with Chan et al.'s
  /// pairwise formulas: for parts (n_a, mean_a, M2_a) and (n_b, mean_b, M2_b) with d = mean_b - mean_a,
  /// n = n_a + n_b, mean = mean_a + d n_b / n, M2 = M2_a + M2_b + d^2 n_a n_b / n.
  void welford(const std::string& ind) {
    const std::string& acc = s_.local;
    const std::string m2 = s_.local2;
    const char* T = ty();
    // the vector form keeps lanes / vector_width mean and M2 vectors (the cpu policy: 8 and 8, 128
    // lanes: each lane's update is a dependent subtract and multiply-add, so more independent lanes
    // keep the pipes busy; row of 4096 f32 in L1: 2.6 -> 2.25 cycles per 16 values against 4 vectors)
    const bool vec = st_.vector;
    const int L = st_.lanes;
    const int nv = vec ? L / V_ : 0;
    const std::string rv = var(R_ - 1);
    out_ += fmt::format("{}{} {} = 0, {} = 0;\n", ind, T, acc, m2);
    out_ += ind + "{\n";
    std::string i1 = ind + "  ";
    out_ += fmt::format("{}{} {}_m[{}], {}_q[{}];\n", i1, T, acc, L, acc, L);
    out_ += fmt::format("{}#pragma omp simd\n{}for (int64_t l = 0; l < {}; ++l) {}_m[l] = {}_q[l] = 0;\n", i1, i1, L, acc, acc);
    out_ += fmt::format("{}int64_t {}_c = 0;\n", i1, acc);
    out_ += fmt::format("{}{} {}_en = 0, {}_em = 0, {}_eq = 0;\n", i1, T, acc, acc, acc);
    // shift: every value is reduced as v - k with k the first value (finite ones only), so that
    // partial means stay small and their merges exact; M2 does not depend on k
    out_ += fmt::format("{}{} {}_k = 0;\n", i1, T, acc);
    std::string nonempty;
    for (size_t i = 0; i < R_; ++i) nonempty += fmt::format("{}{} > 0", i ? " && " : "", n(i));
    out_ += fmt::format("{}if ({}) {{\n", i1, nonempty);
    for (size_t i = 0; i < R_; ++i) out_ += fmt::format("{}  const int64_t {} = 0;\n", i1, var(i));
    std::string k0 = value(i1 + "  ", false);
    out_ += fmt::format("{}  {}_k = {} - {} == 0 ? {} : {}(0);\n{}}}\n", i1, acc, k0, k0, k0, T, i1);
    if (vec) out_ += fmt::format("{}pt::vf {}_vm[{}] = {{}}, {}_vq[{}] = {{}};\n", i1, acc, nv, acc, nv);
    std::string i2 = open_outer_inner(i1);
    const std::string i3 = open_lane_blocks(i2, L, vec, fmt::format("const {} {}_inv = {}(1) / {}(++{}_c);", T, acc, T, T, acc));
    // per lane: v = value - k; d = v - mean; mean += d / count; M2 += d (v - mean)
    const std::string v = vec ? vvalue(i3) : value(i3);
    const std::string m = vec ? fmt::format("{}_vm[{}_i / {}]", acc, acc, V_) : fmt::format("{}_m[{}_i]", acc, acc);
    const std::string q = vec ? fmt::format("{}_vq[{}_i / {}]", acc, acc, V_) : fmt::format("{}_q[{}_i]", acc, acc);
    const std::string VT = vec ? "pt::vf" : T;
    out_ += fmt::format("{}const {} {}_v = {} - {}_k;\n", i3, VT, acc, v, acc);
    out_ += fmt::format("{}const {} {}_d = {}_v - {};\n", i3, VT, acc, acc, m);
    // fused multiply-adds, written out (kernels compile with -ffp-contract=off so that the user's
    // separate multiplies and adds round, overflow and propagate NaN as written)
    const char* fma = vec ? "pt::vfma" : s_.body->dtype == DType::F64 ? "__builtin_fma" : "__builtin_fmaf";
    out_ += fmt::format("{}{} = {}({}_d, {}, {});\n", i3, m, fma, acc, vec ? fmt::format("pt::vbf({}_inv)", acc) : acc + "_inv", m);
    out_ += fmt::format("{}{} = {}({}_d, {}_v - {}, {});\n", i3, q, fma, acc, acc, m, q);
    out_ += i2 + "  }\n" + i2 + "}\n";
    // tail: exact two-pass over at most L - 1 values, merged into the side accumulator
    out_ += fmt::format("{}if ({}_full < {}_n) {{\n", i2, acc, acc);
    std::string i4 = i2 + "  ";
    out_ += fmt::format("{}{} {}_ts = 0, {}_tq = 0;\n", i4, T, acc, acc);
    out_ += fmt::format("{}#pragma omp simd reduction(+:{}_ts)\n", i4, acc);
    out_ += fmt::format("{}for (int64_t {} = {}_full; {} < {}_n; ++{}) {{\n", i4, rv, acc, rv, acc, rv);
    std::string tv = value(i4 + "  ");
    out_ += fmt::format("{}  {}_ts += {} - {}_k;\n{}}}\n", i4, acc, tv, acc, i4);
    out_ += fmt::format("{}const {} {}_tn = {}({}_n - {}_full), {}_tm = {}_ts / {}_tn;\n", i4, T, acc, T, acc, acc, acc, acc, acc);
    out_ += fmt::format("{}#pragma omp simd reduction(+:{}_tq)\n", i4, acc);
    out_ += fmt::format("{}for (int64_t {} = {}_full; {} < {}_n; ++{}) {{\n", i4, rv, acc, rv, acc, rv);
    tv = value(i4 + "  ", false);
    out_ += fmt::format("{}  const {} {}_td = {} - {}_k - {}_tm;\n", i4, T, acc, tv, acc, acc);
    out_ += fmt::format("{}  {}_tq += {}_td * {}_td;\n{}}}\n", i4, acc, acc, acc, i4);
    out_ += fmt::format("{}const {} {}_nn = {}_en + {}_tn, {}_dl = {}_tm - {}_em;\n", i4, T, acc, acc, acc, acc, acc, acc);
    out_ += fmt::format("{}{}_eq += {}_tq + {}_dl * {}_dl * ({}_en * {}_tn / {}_nn);\n", i4, acc, acc, acc, acc, acc, acc, acc);
    out_ += fmt::format("{}{}_em += {}_dl * ({}_tn / {}_nn);\n", i4, acc, acc, acc, acc);
    out_ += fmt::format("{}{}_en = {}_nn;\n", i4, acc, acc);
    out_ += i2 + "}\n";
    close_outer_inner(i2);
    if (vec)
      out_ += fmt::format("{0}for (int j = 0; j < {3}; ++j) {{\n{0}  pt::vst({1}_m + {2} * j, {1}_vm[j]);\n{0}  pt::vst({1}_q + {2} * j, {1}_vq[j]);\n{0}}}\n",
                          i1, acc, V_, nv);
    // merge: the lanes (equal counts c): mean = average of lane means, M2 = sum of lane M2s + c *
    // sum of squared lane-mean deviations; then the side accumulator
    out_ += fmt::format("{}{} {}_lm = 0, {}_lq = 0, {}_ld = 0;\n", i1, T, acc, acc, acc, acc);
    out_ += fmt::format("{}#pragma omp simd reduction(+:{}_lm)\n{}for (int64_t l = 0; l < {}; ++l) {}_lm += {}_m[l];\n", i1, acc, i1, L, acc, acc);
    out_ += fmt::format("{}{}_lm *= {}(1) / {}({});\n", i1, acc, T, T, L);
    out_ += fmt::format("{}#pragma omp simd reduction(+:{}_lq, {}_ld)\n", i1, acc, acc);
    out_ += fmt::format("{}for (int64_t l = 0; l < {}; ++l) {{\n", i1, L);
    out_ += fmt::format("{}  const {} d = {}_m[l] - {}_lm;\n", i1, T, acc, acc);
    out_ += fmt::format("{}  {}_lq += {}_q[l];\n{}  {}_ld += d * d;\n{}}}\n", i1, acc, acc, i1, acc, i1);
    out_ += fmt::format("{}const {} {}_ln = {}({}_c) * {}({});\n", i1, T, acc, T, acc, T, L);
    out_ += fmt::format("{}const {} {}_nt = {}_ln + {}_en, {}_dl = {}_em - {}_lm;\n", i1, T, acc, acc, acc, acc, acc, acc);
    out_ += fmt::format("{}if ({}_nt == 0) {{\n", i1, acc);
    out_ += fmt::format("{}  {} = pt::numeric_limits<{}>::quiet_NaN();\n", i1, acc, T);
    out_ += fmt::format("{}}} else {{\n", i1);
    out_ += fmt::format("{}  {} = {}_k + ({}_lm + {}_dl * ({}_en / {}_nt));\n", i1, acc, acc, acc, acc, acc, acc);
    out_ += fmt::format("{0}  {1} = {2}_lq + {3}({2}_c) * {2}_ld + {2}_eq + {2}_dl * {2}_dl * ({2}_ln * {2}_en / {2}_nt);\n",
                        i1, m2, acc, T);
    out_ += i1 + "}\n";
    out_ += ind + "}\n";
    store_results(ind);
  }

  const Kernel& k_;
  const Stage& s_;
  const Schedule& sc_;
  const StageSchedule& st_;
  int& counter_;
  std::string& out_;
  const size_t K_, R_;
  const int V_;  ///< lanes of the explicit vector form
  const std::vector<PrefetchLoad>& prefetch_;
  const std::set<int>& streamed_;
};

/// Loop-invariant scalar work of a fused pointwise kernel: the maximal subexpressions of its stage
/// bodies that depend on none of the loop variables (a compiled optimizer's bias corrections, pow of
/// the step count, 1 - beta2 in f64 ...). They are computed once before the loop nest instead of once
/// per element or vector step: GCC does not hoist them itself, because in the function OpenMP outlines
/// the buffers lose their __restrict and the stores may alias the hyperparameter loads. Not collected:
/// constants, indices, locals, loads from a buffer the kernel writes, and anything under a select's
/// branches (a select is hoisted whole or not at all, so a guarded value is never computed unguarded).
void collect_invariants(const SExpr& e, const std::vector<sym::Expr>& vars, const std::set<int>& stores,
                        std::unordered_map<const SNode*, bool>& memo, std::vector<SExpr>& out, std::set<const SNode*>& seen) {
  std::function<bool(const SExpr&)> invariant = [&](const SExpr& n) -> bool {
    if (auto it = memo.find(n.get()); it != memo.end()) return it->second;
    bool r = true;
    switch (n->op) {
      case SOp::Const: r = true; break;
      case SOp::Local: r = false; break;
      case SOp::Index:
        for (const sym::Expr& v : vars) r = r && !sym::has_symbol(n->index, v);
        break;
      case SOp::Load:
        r = !stores.count(n->buffer);
        for (const sym::Expr& v : vars) r = r && !sym::has_symbol(n->index, v);
        break;
      case SOp::Cast:
      case SOp::Unary:
      case SOp::Binary:
      case SOp::Where:
      case SOp::Fma:
        for (const SExpr& a : n->args) r = invariant(a) && r;
        break;
    }
    memo[n.get()] = r;
    return r;
  };
  const bool hoistable = e->op != SOp::Const && e->op != SOp::Index && e->op != SOp::Local;
  if (hoistable && invariant(e)) {
    if (seen.insert(e.get()).second) out.push_back(e);
    return;
  }
  if (e->op == SOp::Where) {  // only the condition: the branches run under it
    collect_invariants(e->args[0], vars, stores, memo, out, seen);
    return;
  }
  for (const SExpr& a : e->args) collect_invariants(a, vars, stores, memo, out, seen);
}

void emit_kernel(const Program& p, const Kernel& k, std::string& out) {
  const Schedule& sc = k.schedule;
  if (sc.target != "cpu" || sc.stages.size() != k.stages.size())
    throw CompileError(fmt::format("cpu codegen: {} of program '{}' has {} (loop::apply_schedule with the cpu "
                                   "policy, loop/schedule_cpu.h, must run first)",
                                   k.name, p.name, sc.target.empty() ? "no schedule" : "a '" + sc.target + "' schedule"));
  if (!sc.work)
    throw CompileError(fmt::format("cpu codegen: the schedule of {} in program '{}' has no work estimate", k.name, p.name));
  bool any_vector = sc.vector;
  for (const StageSchedule& st : sc.stages) any_vector |= st.vector;
  if (any_vector && sc.vector_width != 16)
    throw CompileError(fmt::format("cpu codegen: the schedule of {} in program '{}' asks for {}-lane vectors; the cpu "
                                   "runtime's vector form (pt::vf) has 16 f32 lanes",
                                   k.name, p.name, sc.vector_width));
  // ---- signature and prologue: symbols and buffer pointers used ----
  std::set<int> loads, stores;
  std::set<std::string> syms;
  for (auto s : k.outer) collect_syms(s, syms);
  for (const Stage& s : k.stages) {
    collect(s.body, loads, syms);
    for (auto e : s.inner) collect_syms(e, syms);
    for (int o : {s.out, s.out2, s.stash})
      if (o >= 0) stores.insert(o);
    if (s.out >= 0 || s.out2 >= 0) collect_syms(s.out_index, syms);
    if (s.stash >= 0) collect_syms(s.stash_index, syms);
  }
  out += fmt::format("extern \"C\" void {}(char* const* B, const int64_t* S) {{\n", k.name);
  // The parallel threshold. `#pragma omp parallel for if (work >= N)` enters the OpenMP runtime on
  // every call even when the condition is false (libgomp builds a one-thread team and wakes its
  // barrier with a futex system call: ~2 µs, most of a small call). So a kernel whose work is a
  // symbolic expression tests it in C++: the loops are a lambda holding an orphaned `omp for nowait`,
  // called inside `#pragma omp parallel` when the work is large enough and directly otherwise (then
  // the worksharing loop runs on the calling thread alone; called by a thread of a team of several,
  // the user's own parallel region, it opens a team of one first). A constant work below the
  // threshold gets no pragma at all; a constant at or above it the plain parallel loop, or the lambda
  // form when the kernel streams an output (below).
  const bool has_parallel = sc.parallel_axes > 0;
  const bool const_work = sc.work->is_integer();
  const bool serial = has_parallel && sc.work_threshold > 0 && const_work && sc.work->value < sc.work_threshold;
  // Streaming stores (codegen.h: stream_store_min_bytes): the f32 outputs that no stage of the kernel
  // reads, in kernels whose loops run in the `run` lambda, where each thread's share can end with the
  // fence. Vector stores only (the explicit vector form); scalar tails store as usual.
  std::set<int> streamed;
  const int64_t stream_bytes = any_vector && has_parallel && sc.work_threshold > 0 ? stream_store_min_bytes() : 0;
  if (stream_bytes > 0)
    for (const Stage& s : k.stages)
      if (s.out >= 0 && !loads.count(s.out) && p.buffers[static_cast<size_t>(s.out)].dtype == DType::F32)
        streamed.insert(s.out);
  // A constant work that reaches the size takes the lambda form too (its test is then always true);
  // a smaller one never streams and keeps the plain parallel loop.
  const bool const_streams = const_work && !serial && !streamed.empty() && sc.work->value >= (stream_bytes + 3) / 4;
  if (const_work && !const_streams) streamed.clear();
  const bool gated = has_parallel && sc.work_threshold > 0 && (!const_work || const_streams);
  std::string ind = "  ";
  if (gated) {
    std::set<std::string> work_syms;
    collect_syms(sc.work, work_syms);
    for (size_t i = 0; i < p.symbols.size(); ++i)
      if (work_syms.count(p.symbols[i]->name)) out += fmt::format("  const int64_t {} = S[{}];\n", p.symbols[i]->name, i);
    out += fmt::format("  const int64_t work = {};\n", cidx(sc.work));
    if (!streamed.empty()) {
      out += fmt::format("  const bool pt_stream = work >= {};  // f32 elements of a streamed output\n",
                         (stream_bytes + 3) / 4);
      out += "  auto run = [B, S, pt_stream]() {\n";
    } else {
      out += "  auto run = [B, S]() {\n";
    }
    ind = "    ";
  }
  for (size_t i = 0; i < p.symbols.size(); ++i)
    if (syms.count(p.symbols[i]->name)) out += fmt::format("{}const int64_t {} = S[{}];\n", ind, p.symbols[i]->name, i);
  for (int b : loads)
    if (!stores.count(b))
      out += fmt::format("{0}const {1}* __restrict b{2} = reinterpret_cast<const {1}*>(B[{2}]);\n", ind,
                         ctype(p.buffers[static_cast<size_t>(b)].dtype), b);
  for (int b : stores)
    out += fmt::format("{0}{1}* __restrict b{2} = reinterpret_cast<{1}*>(B[{2}]);\n", ind,
                       ctype(p.buffers[static_cast<size_t>(b)].dtype), b);

  // ---- work estimate for the OpenMP threshold ----
  if (!gated) out += fmt::format("  const int64_t work = {};\n", cidx(sc.work));

  int counter = 0;
  const size_t K = k.outer.size();
  // The parallel loop's pragma: `simd` too when that loop is also the innermost, scalar one.
  auto parallel_pragma = [&](bool innermost_scalar) {
    const std::string clauses = fmt::format("{}{}", sc.collapse ? fmt::format(" collapse({})", sc.collapse) : "",
                                            innermost_scalar ? " simd" : "");
    if (serial) return std::string(innermost_scalar ? "#pragma omp simd\n" : "");
    if (gated) return fmt::format("#pragma omp for{} nowait\n", clauses);
    return fmt::format("#pragma omp parallel for{}{}\n", clauses, const_work ? "" : parallel_if(sc));
  };
  // The end of the kernel: the lambda's call, inside a parallel region or not.
  auto close_kernel = [&]() {
    if (gated && !streamed.empty()) out += "    if (pt_stream) pt::stream_fence();\n";
    // Below the threshold inside a caller's team of several threads (a user's own `omp parallel`),
    // the orphaned worksharing loops would bind to that team and split this call's iterations among
    // calls made by other threads: a team of one of its own there.
    if (gated)
      out += fmt::format("  }};\n  if (work >= {}) {{\n#pragma omp parallel\n    run();\n  }} else if "
                         "(__builtin_omp_get_num_threads() > 1) {{\n#pragma omp parallel num_threads(1)\n    run();\n"
                         "  }} else {{\n    run();\n  }}\n",
                         sc.work_threshold);
    out += "}\n\n";
  };
  if (sc.fused_pointwise) {
    // Pointwise stages without an inner domain (one, or several merged by horizontal fusion): one loop
    // nest whose innermost outer loop is the vector loop; the stages share loads (one CSE scope).
    const bool vec = sc.vector;  // then a scalar tail
    const int V = sc.vector_width;
    const std::string xv = K > 0 ? outer_var(K - 1)->name : "", xn = K > 0 ? cidx(k.outer[K - 1]) : "";
    // Loop-invariant scalars, computed once inside `if (the nest is not empty)` (a hoisted load must
    // not run when no iteration would).
    std::vector<std::pair<SExpr, std::string>> hoisted;
    if (K > 0) {
      std::vector<sym::Expr> vars;
      for (size_t i = 0; i < K; ++i) vars.push_back(outer_var(i));
      std::unordered_map<const SNode*, bool> memo;
      std::vector<SExpr> inv;
      std::set<const SNode*> seen;
      for (const Stage& s : k.stages) collect_invariants(s.body, vars, stores, memo, inv, seen);
      if (!inv.empty()) {
        std::string nonempty;
        for (size_t i = 0; i < K; ++i) nonempty += fmt::format("{}({}) > 0", i ? " && " : "", cidx(k.outer[i]));
        out += fmt::format("{}if ({}) {{\n", ind, nonempty);
        ind += "  ";
        BodyEmitter hem(ind, counter, out);
        for (const SExpr& e : inv) hoisted.emplace_back(e, hem.emit(e));
      }
    }
    if (sc.parallel_axes == K && K > 0 && vec) out += fmt::format("{}const int64_t {}_v = {} - {} % {};\n", ind, xv, xn, xn, V);
    if (sc.parallel_axes > 0) out += parallel_pragma(sc.parallel_axes == K && !vec);
    for (size_t i = 0; i < K; ++i) {
      if (i + 1 == K && vec) {
        if (sc.parallel_axes < K) out += fmt::format("{}const int64_t {}_v = {} - {} % {};\n", ind, xv, xn, xn, V);
        out += fmt::format("{}for (int64_t {} = 0; {} < {}_v; {} += {}) {{\n", ind, xv, xv, xv, xv, V);
        VecBodyEmitter em(outer_var(i), ind + "  ", counter, out);
        for (const auto& [e, name] : hoisted) em.bind(e, name);
        for (const Stage& s : k.stages) {
          std::string v = em.vec(s.body);
          out += fmt::format("{}  {};\n", ind, vector_store(streamed, s.out, cidx(s.out_index), v));
        }
        out += ind + "}\n";
        // inside the lambda's parallel region the scalar tail after the worksharing loop runs once
        if (gated && sc.parallel_axes == K) out += ind + "#pragma omp single nowait\n";
        // the scalar tail without `omp simd`: see kTailNote
        out += fmt::format("{}for (int64_t {} = {}_v; {} < {}; ++{}) {{\n", ind, xv, xv, xv, xn, xv);
        ind += "  ";
        continue;
      }
      if (i + 1 == K && sc.parallel_axes < K) out += ind + "#pragma omp simd\n";
      out += loop(ind, outer_var(i)->name, k.outer[i]);
      ind += "  ";
    }
    BodyEmitter em(ind, counter, out);
    for (const auto& [e, name] : hoisted) em.bind(e, name);
    for (const Stage& s : k.stages) {
      std::string v = em.emit(s.body);
      out += fmt::format("{}b{}[{}] = {};\n", ind, s.out, cidx(s.out_index), v);
    }
    for (size_t i = K; i-- > 0;) {
      ind.resize(ind.size() - 2);
      out += ind + "}\n";
    }
    if (!hoisted.empty()) {  // the non-empty test around the hoisted scalars and the nest
      ind.resize(ind.size() - 2);
      out += ind + "}\n";
    }
    close_kernel();
    return;
  }
  if (sc.parallel_axes > 0) out += parallel_pragma(false);
  for (size_t i = 0; i < K; ++i) {
    out += loop(ind, outer_var(i)->name, k.outer[i]);
    ind += "  ";
  }
  // Each stage in the form its StageSchedule names (reduction strategy, vector form, prefetch plan).
  for (size_t j = 0; j < k.stages.size(); ++j) StageEmitter(k, j, counter, out, streamed).emit(ind);
  for (size_t i = K; i-- > 0;) {
    ind.resize(ind.size() - 2);
    out += ind + "}\n";
  }
  close_kernel();
}

}  // namespace

int64_t parse_stream_store_bytes(std::string_view text) {
  int64_t v = -1;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty()) throw ValueError("PROTEAN_CPU_STREAM_BYTES is empty: expected a number of bytes (0: no streaming stores)");
  if (err != std::errc() || end != text.data() + text.size() || v < 0 || v > (int64_t{1} << 50))
    throw ValueError(fmt::format("PROTEAN_CPU_STREAM_BYTES={}: expected a number of bytes up to 2^50 (0: no streaming "
                                 "stores), the size of an output from which the cpu kernels write it around the caches",
                                 text));
  return v;
}

int64_t stream_store_min_bytes() {
  static const int64_t bytes = [] {
    if (const char* e = std::getenv("PROTEAN_CPU_STREAM_BYTES"); e && *e) return parse_stream_store_bytes(e);
    // The last-level cache of CPU 0 as the kernel reports it, e.g. "32768K"; half of it.
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::string text;
    if (f >> text && !text.empty()) {
      int64_t unit = 1;
      if (text.back() == 'K') unit = int64_t{1} << 10;
      if (text.back() == 'M') unit = int64_t{1} << 20;
      if (unit > 1) text.pop_back();
      int64_t v = 0;
      const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (err == std::errc() && end == text.data() + text.size() && v > 0 && v < (int64_t{1} << 40))
        return std::max<int64_t>(v * unit / 2, int64_t{1} << 20);
    }
    return int64_t{16} << 20;
  }();
  return bytes;
}

bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::string_view(e) == "0");
}

std::string generate_kernels(const Program& p) {
  std::string out;
  for (const Kernel& k : p.kernels) emit_kernel(p, k, out);
  return out;
}

std::string_view prelude() { return kCpuPrelude; }

std::string generate_cpp(const Program& p) { return std::string(kCpuPrelude) + "\n" + generate_kernels(p); }

// ---- kernel dedup ---------------------------------------------------------------------------------------
namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// Calls fn(begin, end, id) for every buffer token `b<id>` (an identifier of its own) in `text`.
template <class Fn>
void for_each_buffer_token(const std::string& text, Fn&& fn) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != 'b' || (i > 0 && ident_char(text[i - 1]))) continue;
    size_t j = i + 1;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i + 1 || (j < text.size() && ident_char(text[j]))) continue;
    fn(i, j, std::stoi(text.substr(i + 1, j - i - 1)));
    i = j - 1;
  }
}

/// Rewrites one rendered kernel so that it names buffers by local numbers (b0, b1, ... and B[0],
/// B[1], ...) in order of first use in its body, with the pointer declarations sorted the same way:
/// two kernels that compute the same thing on different buffers then have the same text. `order`
/// gets the global buffer id of each local number.
std::string localize_buffers(const std::string& text, std::vector<int>& order) {
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  auto is_decl = [](const std::string& l) { return l.find("reinterpret_cast<") != std::string::npos && l.find("(B[") != std::string::npos; };
  std::map<int, int> local;
  auto note = [&](int id) {
    if (local.emplace(id, static_cast<int>(order.size())).second) order.push_back(id);
  };
  for (const std::string& l : lines)
    if (!is_decl(l)) for_each_buffer_token(l, [&](size_t, size_t, int id) { note(id); });
  for (const std::string& l : lines)
    if (is_decl(l)) for_each_buffer_token(l, [&](size_t, size_t, int id) { note(id); });
  auto rename = [&](const std::string& l) {
    std::string r;
    size_t last = 0;
    for_each_buffer_token(l, [&](size_t b, size_t e, int id) {
      r += l.substr(last, b - last);
      r += "b" + std::to_string(local.at(id));
      last = e;
    });
    r += l.substr(last);
    if (size_t at = r.find("(B["); at != std::string::npos) {
      size_t close = r.find(']', at);
      int id = std::stoi(r.substr(at + 3, close - at - 3));
      r = r.substr(0, at + 3) + std::to_string(local.at(id)) + r.substr(close);
    }
    return r;
  };
  std::string out;
  std::vector<std::pair<int, std::string>> decls;
  size_t first_decl = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (is_decl(lines[i])) {
      int id = -1;
      for_each_buffer_token(lines[i], [&](size_t, size_t, int x) {
        if (id < 0) id = x;
      });
      decls.emplace_back(local.at(id), rename(lines[i]));
      first_decl = std::min(first_decl, i);
    }
  }
  std::sort(decls.begin(), decls.end());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == first_decl)
      for (const auto& [n, d] : decls) out += d;
    if (!is_decl(lines[i])) out += rename(lines[i]);
  }
  return out;
}

/// Renumbers the identifiers `<prefix><N>` and `<prefix><N>_<suffix>` of one kernel (lowering's
/// program-wide temporaries t7, acc12_va, ...) by order of first appearance: a bijection on the
/// numbers within the kernel, so the meaning is unchanged and equal kernels get equal text.
std::string renumber_locals(const std::string& text, const std::string& prefix) {
  std::map<std::string, int> local;
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (!ident_char(text[i])) {
      out += text[i++];
      continue;
    }
    size_t j = i;
    while (j < text.size() && ident_char(text[j])) ++j;
    std::string tok = text.substr(i, j - i);
    size_t k = prefix.size();
    if (tok.compare(0, k, prefix) == 0 && k < tok.size() && std::isdigit(static_cast<unsigned char>(tok[k]))) {
      size_t e = k;
      while (e < tok.size() && std::isdigit(static_cast<unsigned char>(tok[e]))) ++e;
      if (e == tok.size() || tok[e] == '_') {
        std::string num = tok.substr(k, e - k);
        auto [it, fresh] = local.emplace(num, static_cast<int>(local.size()));
        (void)fresh;
        tok = prefix + std::to_string(it->second) + tok.substr(e);
      }
    }
    out += tok;
    i = j;
  }
  return out;
}

}  // namespace

DedupSource generate_cpp_dedup(const Program& p) {
  DedupSource r;
  r.text = std::string(kCpuPrelude) + "\n";
  std::unordered_map<std::string, std::string> first;  // body with the name blanked → defining kernel
  for (const Kernel& k : p.kernels) {
    std::string one;
    emit_kernel(p, k, one);
    std::vector<int> order;
    std::string local = renumber_locals(renumber_locals(localize_buffers(one, order), "t"), "acc");
    r.kernel_buffers.push_back(std::move(order));
    const std::string head = fmt::format("extern \"C\" void {}(", k.name);
    std::string blank = local;
    if (blank.compare(0, head.size(), head) == 0) blank.replace(0, head.size(), "extern \"C\" void @(");
    auto [it, fresh] = first.emplace(std::move(blank), k.name);
    if (fresh) {
      r.text += local;
      ++r.unique_kernels;
    } else {
      r.text += fmt::format("extern \"C\" void {}(char* const* B, const int64_t* S) __attribute__((alias(\"{}\")));\n",
                            k.name, it->second);
    }
  }
  return r;
}

}  // namespace protean::backend::cpu
