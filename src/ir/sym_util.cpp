#include "ir/sym_util.h"

#include <fmt/format.h>

#include <stdexcept>

#include "protean/error.h"
#include "sym/printer.h"

namespace protean::ir {

sym::Expr to_expr(const SymInt& s) { return s.is_symbolic() ? s.expr() : sym::integer(s.hint()); }

SymInt from_expr(sym::Expr e, int64_t hint) {
  if (e->is_integer()) return SymInt(e->value);
  return SymInt(e, hint);
}

std::string symint_text(const SymInt& s) {
  return s.is_symbolic() ? sym::print(s.expr()) : std::to_string(s.hint());
}

std::string symints_text(const SymIntVec& v) {
  std::string r = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) r += ", ";
    r += symint_text(v[i]);
  }
  return r + "]";
}

bool same_symint(const SymInt& a, const SymInt& b) {
  if (a.is_symbolic() || b.is_symbolic()) return a.expr() == b.expr();
  return a.hint() == b.hint();
}

bool same_symints(const SymIntVec& a, const SymIntVec& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_symint(a[i], b[i])) return false;
  return true;
}

SymIntVec contiguous_strides_of(const SymIntVec& sizes) {
  SymIntVec strides(sizes.size());
  SymInt acc(1);
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = acc;
    const SymInt& s = sizes[i];
    if (!acc.is_symbolic() && !s.is_symbolic())
      acc = SymInt(acc.hint() * s.hint());
    else
      acc = from_expr(sym::mul(to_expr(acc), to_expr(s)), acc.hint() * s.hint());
  }
  return strides;
}

int64_t evaluate_symint(const SymInt& s, const SymbolValues& values) {
  if (!s.is_symbolic()) return s.hint();
  try {
    return sym::evaluate(s.expr(), values);
  } catch (const std::out_of_range&) {
    std::string missing;
    for (sym::Expr f : sym::free_symbols(s.expr()))
      if (!values.count(f)) missing += (missing.empty() ? "" : ", ") + f->name;
    throw CompileError(fmt::format("size expression {} mentions unbound symbol(s) {}", sym::print(s.expr()),
                                   missing));
  } catch (const std::domain_error&) {
    throw CompileError(fmt::format("size expression {} divides by zero", sym::print(s.expr())));
  }
}

}  // namespace protean::ir
