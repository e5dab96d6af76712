#include "backend/kernel_symbols.h"

#include <unordered_set>
#include <variant>

#include "ir/sym_util.h"

namespace protean::backend {

std::vector<sym::Expr> kernel_symbols(const BackendInput& in) {
  const ir::Graph& g = *in.graph;
  std::vector<sym::Expr> r = in.symbols;
  std::unordered_set<sym::Expr> seen(r.begin(), r.end());
  auto add = [&](sym::Expr e) {
    for (sym::Expr f : sym::free_symbols(e))
      if (seen.insert(f).second) r.push_back(f);
  };
  for (const ir::Value& v : g.values())
    for (const SymInt& s : v.sizes) add(ir::to_expr(s));
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && n.op == ops::OpKind::local_scalar_dense)
      if (const auto* a = n.attrs.find("symbol"); a && std::holds_alternative<SymInt>(*a)) add(ir::to_expr(std::get<SymInt>(*a)));
  for (const sym::RuntimeAssert& a : in.runtime_asserts) add(a.expr);
  return r;
}

}  // namespace protean::backend
