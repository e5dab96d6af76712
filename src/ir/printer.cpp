#include "ir/printer.h"

#include <fmt/format.h>

#include <cctype>

#include "ir/sym_util.h"

namespace protean::ir {

namespace {

bool plain_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

std::string quoted(std::string_view s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (c == '\n') {
      r += "\\n";
      continue;
    }
    r += c;
  }
  return r + "\"";
}

std::string name_ref(std::string_view name) { return plain_name(name) ? fmt::format("%{}", name) : "%" + quoted(name); }

std::string defs(const Graph& g, const Node& n) {
  std::string s;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (i) s += ", ";
    s += fmt::format("{} : {}", value_ref(g, n.outputs[i]), type_str(g.value(n.outputs[i])));
  }
  return s;
}

std::string refs(const Graph& g, const std::vector<ValueId>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) {
    if (i) s += ", ";
    s += value_ref(g, vs[i]);
  }
  return s;
}

std::string comment(const core::SourceLocation& loc) { return loc.known() ? "  # " + loc.str() : ""; }

}  // namespace

std::string value_ref(const Graph& g, ValueId v) {
  if (v == kNoValue) return "None";
  if (v < 0 || static_cast<size_t>(v) >= g.values().size()) return fmt::format("%<bad value {}>", v);
  return name_ref(g.value(v).name);
}

std::string type_str(const Value& v) { return fmt::format("{}{}", short_name(v.dtype), symints_text(v.sizes)); }

std::string attr_text(const ops::AttrValue& v) {
  if (const auto* s = std::get_if<SymInt>(&v)) return symint_text(*s);
  if (const auto* s = std::get_if<SymIntVec>(&v)) return symints_text(*s);
  if (const auto* s = std::get_if<std::string>(&v)) return quoted(*s);
  return ops::attr_to_string(v);
}

std::string print_node(const Graph& g, const Node& n) {
  switch (n.kind) {
    case NodeKind::Placeholder:
      return fmt::format("{} = placeholder()", defs(g, n));
    case NodeKind::Constant:
      return fmt::format("{} = constant(){}", defs(g, n), comment(n.loc));
    case NodeKind::Call: {
      std::string args = refs(g, n.inputs);
      for (const auto& a : n.attrs.items()) {
        if (!args.empty()) args += ", ";
        args += fmt::format("{}={}", a.name, attr_text(a.value));
      }
      return fmt::format("{} = {}({}){}", defs(g, n), ops::op_name(n.op), args, comment(n.loc));
    }
    case NodeKind::Output:
      return fmt::format("return ({})", refs(g, n.inputs));
  }
  return "?";
}

namespace {

void print_graph(const Graph& g, const std::string& indent, std::string& s) {
  s += indent + "graph " + g.name + "(";
  bool first = true;
  for (const auto& n : g.nodes()) {
    if (n.kind != NodeKind::Placeholder) continue;
    if (!first) s += ", ";
    first = false;
    s += defs(g, n);
  }
  s += "):\n";
  const std::string inner = indent + "  ";
  bool has_output = false;
  for (const auto& n : g.nodes()) {
    if (n.kind == NodeKind::Placeholder) continue;
    has_output |= n.kind == NodeKind::Output;
    s += inner + print_node(g, n) + "\n";
    for (const auto& sub : n.subgraphs) print_graph(*sub, inner + "  ", s);
  }
  if (!has_output) s += inner + "return ()\n";
}

}  // namespace

std::string print(const Graph& g) {
  std::string s;
  print_graph(g, "", s);
  return s;
}

}  // namespace protean::ir
