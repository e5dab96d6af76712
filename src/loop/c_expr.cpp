#include "loop/c_expr.h"

#include <fmt/format.h>

#include <cmath>

namespace protean::loop {

CScalarForm c_scalar_form(ScalarOp op) {
  using S = ScalarOp;
  switch (op) {
    case S::abs: return {"{ns}abs({a})", false};
    case S::neg: return {"{ns}neg({a})", false};
    case S::logical_not: return {"(!{a})", false};
    case S::exp: return {"{ns}exp({a})", false};
    case S::log: return {"{ns}log({a})", false};
    case S::sqrt: return {"{ns}sqrt({a})", false};
    case S::rsqrt: return {"{ns}rsqrt({a})", false};
    case S::reciprocal: return {"{ns}reciprocal({a})", false};
    case S::sin: return {"{ns}sin({a})", false};
    case S::cos: return {"{ns}cos({a})", false};
    case S::tanh: return {"{ns}tanh({a})", false};
    case S::erf: return {"{ns}erf({a})", false};
    case S::normal_cdf: return {"{ns}normal_cdf({a})", false};
    case S::sigmoid: return {"{ns}sigmoid({a})", false};
    case S::ceil: return {"{ns}ceil({a})", false};
    case S::floor: return {"{ns}floor({a})", false};
    case S::round: return {"{ns}round({a})", false};
    case S::relu: return {"{ns}relu({a})", false};
    case S::sign: return {"{ns}sign({a})", false};
    case S::add: return {"({a} + {b})", true};
    case S::sub: return {"({a} - {b})", true};
    case S::mul: return {"({a} * {b})", true};
    case S::div: return {"({a} / {b})", true};
    case S::max: return {"{ns}maxn<{T}>({a}, {b})", false};
    case S::min: return {"{ns}minn<{T}>({a}, {b})", false};
    case S::pow: return {"{ns}powf_<{T}>({a}, {b})", false};
    case S::eq: return {"({a} == {b})", true};
    case S::ne: return {"({a} != {b})", true};
    case S::lt: return {"({a} < {b})", true};
    case S::le: return {"({a} <= {b})", true};
    case S::gt: return {"({a} > {b})", true};
    case S::ge: return {"({a} >= {b})", true};
    case S::logical_and: return {"({a} && {b})", true};
    case S::logical_or: return {"({a} || {b})", true};
  }
  return {"0 /* unknown scalar op */", false};
}

const char* c_type(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::U8: return "uint8_t";
    case DType::I8: return "int8_t";
    case DType::I32: return "int32_t";
    case DType::I64: return "int64_t";
    case DType::F16: return "uint16_t";
    case DType::BF16: return "uint16_t";
    case DType::F32: return "float";
    case DType::F64: return "double";
  }
  return "void";
}

const char* c_value_type(DType t, const CDialect& d) {
  if (d.half_as_f32 && (t == DType::F16 || t == DType::BF16)) return "float";
  return c_type(t);
}

std::string c_index(const sym::Expr& e, const CDialect& d) {
  using sym::Kind;
  auto sub = [&](size_t i) { return c_index(e->args[i], d); };
  auto join = [&](const char* sep) {
    std::string r;
    for (size_t i = 0; i < e->args.size(); ++i) r += (i ? sep : "") + sub(i);
    return "(" + r + ")";
  };
  switch (e->kind) {
    case Kind::Integer: return e->value < 0 ? fmt::format("({})", e->value) : fmt::format("{}", e->value);
    case Kind::Symbol: return e->name;
    case Kind::Add: return join(" + ");
    case Kind::Mul: return join(" * ");
    case Kind::Pow: {
      if (!e->args[1]->is_integer()) return "0 /* unsupported pow */";
      std::string b = sub(0), r = "1";
      for (int64_t i = 0; i < e->args[1]->value; ++i) r = i ? r + " * " + b : b;
      return "(" + r + ")";
    }
    case Kind::FloorDiv: return "(" + sub(0) + " / " + sub(1) + ")";
    case Kind::CeilDiv: return "((" + sub(0) + " + " + sub(1) + " - 1) / " + sub(1) + ")";
    case Kind::Mod: return "(" + sub(0) + " % " + sub(1) + ")";
    case Kind::Max:
    case Kind::Min: {
      std::string r = sub(0);
      for (size_t i = 1; i < e->args.size(); ++i)
        r = fmt::format("{}{}({}, {})", d.ns, e->kind == Kind::Max ? "imax" : "imin", r, sub(i));
      return r;
    }
    case Kind::True: return "true";
    case Kind::False: return "false";
    case Kind::Eq: return "(" + sub(0) + " == " + sub(1) + ")";
    case Kind::Ne: return "(" + sub(0) + " != " + sub(1) + ")";
    case Kind::Lt: return "(" + sub(0) + " < " + sub(1) + ")";
    case Kind::Le: return "(" + sub(0) + " <= " + sub(1) + ")";
    case Kind::Gt: return "(" + sub(0) + " > " + sub(1) + ")";
    case Kind::Ge: return "(" + sub(0) + " >= " + sub(1) + ")";
    case Kind::And: return join(" && ");
    case Kind::Or: return join(" || ");
    case Kind::Not: return "(!" + sub(0) + ")";
  }
  return "0";
}

std::string c_const(const SNode& n, const CDialect& d) {
  const char* t = c_value_type(n.dtype, d);
  if (n.dtype == DType::Bool) return n.ival ? "true" : "false";
  if (!is_floating(n.dtype)) return fmt::format("{}({})", t, n.ival);
  if (std::isnan(n.fval)) return fmt::format("{}<{}>::quiet_NaN()", d.limits, t);
  if (std::isinf(n.fval)) return fmt::format("{}{}<{}>::infinity()", n.fval < 0 ? "-" : "", d.limits, t);
  return fmt::format("{}({:.17g})", t, n.fval);
}

std::string c_fill(std::string_view pattern, const std::vector<std::string>& a, std::string_view type, const CDialect& d) {
  return fmt::format(fmt::runtime(pattern), fmt::arg("a", a[0]), fmt::arg("b", a.size() > 1 ? a[1] : std::string()),
                     fmt::arg("T", type), fmt::arg("ns", d.ns));
}

std::string c_apply(const SNode& n, const std::vector<std::string>& a, const CDialect& d) {
  const char* t = c_value_type(n.dtype, d);
  const bool half = n.dtype == DType::F16 || n.dtype == DType::BF16;
  switch (n.op) {
    case SOp::Cast:
      if (d.half_as_f32 && half)  // f32 compute: the value a 16-bit store of it would hold
        return fmt::format("{}round_{}(static_cast<float>({}))", d.ns, n.dtype == DType::BF16 ? "bf16" : "f16", a[0]);
      return fmt::format("static_cast<{}>({})", t, a[0]);
    case SOp::Fma:
      return fmt::format("{}({}, {}, {})", n.dtype == DType::F32 || (d.half_as_f32 && half) ? d.fma_f32 : d.fma_f64, a[0], a[1], a[2]);
    case SOp::Unary:
    case SOp::Binary: {
      if (n.op == SOp::Binary && n.fn == ScalarOp::div && is_floating(n.dtype) && !d.div_float.empty())
        return c_fill(d.div_float, a, t, d);
      const CScalarForm form = c_scalar_form(n.fn);
      std::string r = c_fill(form.pattern, a, t, d);
      // integer arithmetic on narrow types promotes to int in C++: cast back
      if (!form.infix || n.dtype == DType::Bool || is_floating(n.dtype) || n.dtype == DType::I64) return r;
      return fmt::format("{}{}", t, r);
    }
    case SOp::Load:
    case SOp::Const:
    case SOp::Index:
    case SOp::Local:
    case SOp::Where: break;
  }
  return "0 /* not an operation */";
}

std::string CBodyEmitter::emit(const SExpr& e) {
  std::string key = s_text(e) + ":" + std::string(short_name(e->dtype));
  if (auto it = names_.find(key); it != names_.end()) return it->second;
  std::string expr;
  switch (e->op) {
    case SOp::Load: expr = load(*e); break;
    case SOp::Const: return c_const(*e, d_);
    case SOp::Index: expr = fmt::format("int64_t({})", index(e->index)); break;
    case SOp::Local: return e->name;
    case SOp::Where: {
      const std::string c = emit(e->args[0]);  // emitted first: argument evaluation order is unspecified
      expr = fmt::format("({} ? {} : {})", c, inline_expr(e->args[1]), inline_expr(e->args[2]));
      break;
    }
    case SOp::Cast:
    case SOp::Unary:
    case SOp::Binary:
    case SOp::Fma: {
      if (const std::string f = contracted(e); !f.empty()) {
        expr = f;
        break;
      }
      std::vector<std::string> a;
      for (const auto& x : e->args) a.push_back(emit(x));
      expr = c_apply(*e, a, d_);
      break;
    }
  }
  std::string name = fmt::format("t{}", counter_++);
  out_ += fmt::format("{}const {} {} = {};\n", indent_, c_value_type(e->dtype, d_), name, expr);
  names_[key] = name;
  return name;
}

std::string CBodyEmitter::contracted(const SExpr& e) {
  if (!d_.contract_f32 || e->op != SOp::Binary || e->fn != ScalarOp::add || e->args.size() != 2) return "";
  if (std::string_view(c_value_type(e->dtype, d_)) != "float") return "";
  for (int m = 0; m < 2; ++m) {
    const SExpr& mul = e->args[static_cast<size_t>(m)];
    if (mul->op != SOp::Binary || mul->fn != ScalarOp::mul || mul->dtype != e->dtype || mul->args.size() != 2) continue;
    // an operand already named (computed earlier) is reused; the product itself is not emitted
    const std::string a = emit(mul->args[0]), b = emit(mul->args[1]), c = emit(e->args[static_cast<size_t>(1 - m)]);
    return fmt::format("{}({}, {}, {})", d_.fma_f32, a, b, c);
  }
  return "";
}

std::string CBodyEmitter::inline_expr(const SExpr& e) {
  std::string key = s_text(e) + ":" + std::string(short_name(e->dtype));
  if (auto it = names_.find(key); it != names_.end()) return it->second;
  switch (e->op) {
    case SOp::Load: return load(*e);
    case SOp::Const: return c_const(*e, d_);
    case SOp::Index: return fmt::format("int64_t({})", index(e->index));
    case SOp::Local: return e->name;
    case SOp::Where:
      return fmt::format("({} ? {} : {})", inline_expr(e->args[0]), inline_expr(e->args[1]), inline_expr(e->args[2]));
    case SOp::Cast:
    case SOp::Unary:
    case SOp::Binary:
    case SOp::Fma: {
      std::vector<std::string> a;
      for (const auto& x : e->args) a.push_back(inline_expr(x));
      return c_apply(*e, a, d_);
    }
  }
  return "0";
}

void CBodyEmitter::bind(const SExpr& e, std::string name) { names_[s_text(e) + ":" + std::string(short_name(e->dtype))] = std::move(name); }

std::string CBodyEmitter::load(const SNode& n) { return fmt::format("b{}[{}]", n.buffer, index(n.index)); }

std::string CBodyEmitter::index(const sym::Expr& e) { return c_index(e, d_); }

}  // namespace protean::loop
