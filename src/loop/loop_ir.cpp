#include "loop/loop_ir.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "loop/schedule_policy.h"
#include "sym/printer.h"
#include "sym/simplify.h"

namespace protean::loop {

namespace {
SExpr make(SNode n) { return std::make_shared<const SNode>(std::move(n)); }
SNode node(SOp op, DType dtype) {
  SNode n;
  n.op = op;
  n.dtype = dtype;
  return n;
}
}  // namespace

SExpr s_load(int buffer, DType dtype, sym::Expr index) {
  SNode n = node(SOp::Load, dtype);
  n.buffer = buffer;
  n.index = index;
  return make(std::move(n));
}
SExpr s_const(double v, DType dtype) {
  SNode n = node(SOp::Const, dtype);
  if (is_floating(dtype)) n.fval = v;
  else n.ival = static_cast<int64_t>(v);
  return make(std::move(n));
}
SExpr s_index(sym::Expr index, DType dtype) {
  if (index->is_integer() && std::abs(index->value) < (int64_t{1} << 53)) return s_const(static_cast<double>(index->value), dtype);
  SNode n = node(SOp::Index, DType::I64);
  n.index = index;
  return s_cast(make(std::move(n)), dtype);
}
SExpr s_local(const std::string& name, DType dtype) {
  SNode n = node(SOp::Local, dtype);
  n.name = name;
  return make(std::move(n));
}
SExpr s_cast(SExpr a, DType dtype) {
  if (a->dtype == dtype) return a;
  if (a->op == SOp::Const) {
    SNode n = *a;
    n.dtype = dtype;
    if (is_floating(dtype) && !is_floating(a->dtype)) n.fval = static_cast<double>(a->ival);
    if (!is_floating(dtype) && is_floating(a->dtype)) n.ival = static_cast<int64_t>(a->fval);
    if (dtype == DType::Bool) n.ival = is_floating(a->dtype) ? (a->fval != 0) : (a->ival != 0);
    return make(std::move(n));
  }
  SNode n = node(SOp::Cast, dtype);
  n.args = {std::move(a)};
  return make(std::move(n));
}
SExpr s_unary(ScalarOp fn, SExpr a, DType dtype) {
  if (scalar_arity(fn) != 1) throw std::invalid_argument(fmt::format("s_unary: {} takes two operands", scalar_name(fn)));
  SNode n = node(SOp::Unary, dtype);
  n.fn = fn;
  n.args = {std::move(a)};
  return make(std::move(n));
}
SExpr s_binary(ScalarOp fn, SExpr a, SExpr b, DType dtype) {
  if (scalar_arity(fn) != 2) throw std::invalid_argument(fmt::format("s_binary: {} takes one operand", scalar_name(fn)));
  SNode n = node(SOp::Binary, dtype);
  n.fn = fn;
  n.args = {std::move(a), std::move(b)};
  return make(std::move(n));
}
SExpr s_where(SExpr c, SExpr a, SExpr b) {
  SNode n = node(SOp::Where, a->dtype);
  n.args = {std::move(c), std::move(a), std::move(b)};
  return make(std::move(n));
}

SExpr s_fma(SExpr a, SExpr b, SExpr c) {
  const DType d = a->dtype;
  if (d != DType::F32 && d != DType::F64) throw std::invalid_argument(fmt::format("s_fma: no fused multiply-add in {}", short_name(d)));
  SNode n = node(SOp::Fma, d);
  n.args = {std::move(a), s_cast(std::move(b), d), s_cast(std::move(c), d)};
  return make(std::move(n));
}

size_t s_size(const SExpr& e) {
  size_t n = 1;
  for (const auto& a : e->args) n += s_size(a);
  return n;
}

size_t s_depth(const SExpr& e) {
  std::unordered_map<const SNode*, size_t> depth;
  std::vector<std::pair<const SNode*, bool>> stack{{e.get(), false}};
  while (!stack.empty()) {
    auto [n, expanded] = stack.back();
    if (depth.count(n)) {
      stack.pop_back();
      continue;
    }
    if (!expanded) {
      stack.back().second = true;
      for (const auto& a : n->args)
        if (!depth.count(a.get())) stack.push_back({a.get(), false});
      continue;
    }
    size_t d = 1;
    for (const auto& a : n->args) d = std::max(d, depth.at(a.get()) + 1);
    depth[n] = d;
    stack.pop_back();
  }
  return depth.at(e.get());
}

SExpr s_rewrite(const SExpr& e, const std::function<SExpr(const SExpr&)>& f) {
  SExpr cur = e;
  if (!e->args.empty()) {
    std::vector<SExpr> args;
    bool changed = false;
    for (const auto& a : e->args) {
      args.push_back(s_rewrite(a, f));
      changed |= args.back() != a;
    }
    if (changed) {
      SNode n = *e;
      n.args = std::move(args);
      cur = make(std::move(n));
    }
  }
  SExpr r = f(cur);
  return r ? r : cur;
}

std::string s_text(const SExpr& e, bool typed) {
  auto sub = [&](size_t i) { return s_text(e->args[i], typed); };
  switch (e->op) {
    case SOp::Load: return fmt::format("load(b{}, {})", e->buffer, sym::print(e->index));
    case SOp::Const: {
      std::string v = is_floating(e->dtype) ? fmt::format("{}", e->fval) : fmt::format("{}", e->ival);
      return typed ? fmt::format("{}:{}", v, short_name(e->dtype)) : v;
    }
    case SOp::Index:
      return typed && e->dtype != DType::I64 ? fmt::format("index({}):{}", sym::print(e->index), short_name(e->dtype))
                                             : fmt::format("index({})", sym::print(e->index));
    case SOp::Local: return e->name;
    case SOp::Cast: return fmt::format("{}({})", short_name(e->dtype), sub(0));
    case SOp::Unary: return fmt::format("{}({})", scalar_name(e->fn), sub(0));
    case SOp::Binary: return fmt::format("{}({}, {})", scalar_name(e->fn), sub(0), sub(1));
    case SOp::Where: return fmt::format("where({}, {}, {})", sub(0), sub(1), sub(2));
    case SOp::Fma: return fmt::format("fma({}, {}, {})", sub(0), sub(1), sub(2));
  }
  return "?";
}

sym::Expr outer_var(size_t k) { return sym::symbol(fmt::format("x{}", k)); }
sym::Expr inner_var(size_t k) { return sym::symbol(fmt::format("r{}", k)); }

namespace {
const sym::RangeAnalyzer& index_ranges() {
  // Loop variables and sizes are non-negative; that is all the simplifier may assume here.
  thread_local sym::RangeAnalyzer ra(sym::ValueRange{0, sym::kIntOo});
  return ra;
}
}  // namespace

sym::Expr simplify_index(sym::Expr e) { return sym::simplify(e, &index_ranges()); }

sym::Expr linear_index(const std::vector<sym::Expr>& idx, const std::vector<sym::Expr>& sizes) {
  sym::Expr r = sym::integer(0), stride = sym::integer(1);
  for (size_t k = sizes.size(); k-- > 0;) {
    if (!sizes[k]->is_integer(1)) r = sym::add(r, sym::mul(idx[k], stride));
    stride = sym::mul(stride, sizes[k]);
  }
  return simplify_index(r);
}

namespace {
std::string sizes_text(const std::vector<sym::Expr>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + sym::print(s[i]);
  return r + "]";
}
const char* kind_text(BufferKind k) {
  switch (k) {
    case BufferKind::Input: return "input";
    case BufferKind::Constant: return "constant";
    case BufferKind::Temp: return "temp";
    case BufferKind::Output: return "output";
  }
  return "?";
}
}  // namespace

void remove_stage(Program& p, int kernel, int stage) {
  Kernel& km = p.kernels[static_cast<size_t>(kernel)];
  km.stages.erase(km.stages.begin() + stage);
  if (static_cast<size_t>(stage) < km.schedule.stages.size()) km.schedule.stages.erase(km.schedule.stages.begin() + stage);
  if (!km.stages.empty()) return;
  for (size_t si = 0; si < p.steps.size(); ++si) {
    if (!p.steps[si].is_kernel || p.steps[si].index != kernel) continue;
    std::vector<int> release = p.steps[si].release;
    p.steps.erase(p.steps.begin() + static_cast<long>(si));
    if (si < p.steps.size()) p.steps[si].release.insert(p.steps[si].release.end(), release.begin(), release.end());
    break;
  }
  p.kernels.erase(p.kernels.begin() + kernel);
  for (Step& s2 : p.steps)
    if (s2.is_kernel && s2.index > kernel) --s2.index;
}

std::string to_text(const Program& p) {
  std::string out = fmt::format("program {} (symbols:", p.name);
  for (auto s : p.symbols) out += " " + sym::print(s);
  out += ")\n";
  for (const Buffer& b : p.buffers) {
    out += fmt::format("  b{} : {}{} {}", b.id, short_name(b.dtype), sizes_text(b.sizes), kind_text(b.kind));
    if (b.kind == BufferKind::Input) out += fmt::format(" #{}", b.input_index);
    if (b.slot >= 0) out += fmt::format(" slot{}", b.slot);
    if (b.from_extern) out += " extern";
    if (b.alias >= 0) out += fmt::format(" into b{}[{}]", b.alias, b.alias_offset);
    out += "\n";
  }
  for (const Step& st : p.steps) {
    if (st.is_kernel) {
      const Kernel& k = p.kernels[static_cast<size_t>(st.index)];
      out += fmt::format("  {} over {}:\n", k.name, sizes_text(k.outer));
      if (!k.schedule.target.empty()) out += "    " + schedule_text(k) + "\n";
      for (size_t si = 0; si < k.stages.size(); ++si) {
        const Stage& s = k.stages[si];
        if (s.kind == StageKind::Reduction && s.reduce_op == "welford")
          out += fmt::format("    {}, {} = reduce_welford over {}: {}", s.local, s.local2, sizes_text(s.inner), s_text(s.body, true));
        else if (s.kind == StageKind::Reduction)
          out += fmt::format("    {} = reduce_{} over {}: {}", s.local, s.reduce_op, sizes_text(s.inner), s_text(s.body, true));
        else
          out += fmt::format("    pointwise over {}: {}", sizes_text(s.inner), s_text(s.body, true));
        if (s.stash >= 0) out += fmt::format(" stash b{}[{}]", s.stash, sym::print(s.stash_index));
        if (s.out >= 0) out += fmt::format(" -> b{}[{}]", s.out, sym::print(s.out_index));
        if (s.out2 >= 0) out += fmt::format("{} b{}[{}]", s.out >= 0 ? "," : " -> none,", s.out2, sym::print(s.out_index));
        if (const std::string st = stage_schedule_text(k, si); !st.empty()) out += " {" + st + "}";
        out += "\n";
      }
    } else {
      const Extern& e = p.externs[static_cast<size_t>(st.index)];
      out += fmt::format("  extern {}(", ops::op_name(e.op));
      for (size_t i = 0; i < e.inputs.size(); ++i) {
        std::string b = e.inputs[i] < 0 ? std::string("None") : fmt::format("b{}", e.inputs[i]);
        if (i < e.views.size() && e.views[i].offset) {
          const ExternView& v = e.views[i];
          auto list = [](const std::vector<sym::Expr>& xs) {
            std::string r;
            for (const sym::Expr& x : xs) r += (r.empty() ? "" : ", ") + sym::print(x);
            return "[" + r + "]";
          };
          b = fmt::format("view({}, {}, {}, {})", b, list(v.sizes), list(v.strides), sym::print(v.offset));
        }
        out += (i ? ", " : "") + b;
      }
      out += ") ->";
      for (int o : e.outputs) out += fmt::format(" b{}", o);
      if (const auto* post = e.attrs.find("post_ops"))
        if (const auto* text = std::get_if<std::string>(post)) out += fmt::format(" post_ops=\"{}\"", *text);
      if (!e.where.empty()) {
        std::string w = e.where;
        for (char& c : w)
          if (c == '"') c = '\'';
          else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
        out += fmt::format(" at=\"{}\"", w);
      }
      if (!e.subgraphs.empty()) out += fmt::format("  (runs the compiled program of one of {} branches)", e.subgraphs.size());
      out += "\n";
    }
    if (!st.release.empty()) {
      out += "    release";
      for (int b : st.release) out += fmt::format(" b{}", b);
      out += "\n";
    }
  }
  out += "  return";
  for (int o : p.outputs) out += fmt::format(" b{}", o);
  return out + "\n";
}

}  // namespace protean::loop
