// Node attribute getters and Value printing (onnx_ir.h).
#include "frontends/onnx/onnx_ir.h"

#include <fmt/format.h>

namespace protean::onnx::detail {

std::string Node::label() const { return fmt::format("'{}' ({})", name, op_type); }

const Attr* Node::attr(const std::string& key) const {
  auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : &it->second;
}

namespace {
const Attr* typed(const Node& n, const std::string& key, Attr::Type want) {
  const Attr* a = n.attr(key);
  if (a && a->type != want)
    throw FormatError(fmt::format("attribute '{}' of node {} has type {}, expected {}", key, n.label(),
                                  attr_type_name(a->type), attr_type_name(want)));
  return a;
}
}  // namespace

int64_t Node::get_int(const std::string& key, int64_t dflt) const {
  const Attr* a = typed(*this, key, Attr::Type::Int);
  return a ? a->i : dflt;
}
double Node::get_float(const std::string& key, double dflt) const {
  const Attr* a = typed(*this, key, Attr::Type::Float);
  return a ? a->f : dflt;
}
std::string Node::get_string(const std::string& key, const std::string& dflt) const {
  const Attr* a = typed(*this, key, Attr::Type::String);
  return a ? a->s : dflt;
}
IntVec Node::get_ints(const std::string& key, const IntVec& dflt) const {
  const Attr* a = typed(*this, key, Attr::Type::Ints);
  return a ? a->ints : dflt;
}
std::optional<IntVec> Node::opt_ints(const std::string& key) const {
  const Attr* a = typed(*this, key, Attr::Type::Ints);
  if (!a) return std::nullopt;
  return a->ints;
}
std::vector<std::string> Node::get_strings(const std::string& key) const {
  const Attr* a = typed(*this, key, Attr::Type::Strings);
  return a ? a->strings : std::vector<std::string>{};
}
const Tensor* Node::get_tensor(const std::string& key) const {
  const Attr* a = typed(*this, key, Attr::Type::Tensor);
  return a ? &a->t : nullptr;
}
const Graph* Node::get_graph(const std::string& key) const {
  const Attr* a = typed(*this, key, Attr::Type::Graph);
  return a ? a->g.get() : nullptr;
}

std::string Value::describe() const {
  switch (kind) {
    case Kind::None: return "<none>";
    case Kind::Tensor: return fmt::format("{}{}", short_name(t.dtype()), to_string(t.sizes()));
    case Kind::Ints: {
      if (scalar && !ints.empty()) return fmt::format("{} host scalar {}", short_name(dtype), ints[0].str());
      return fmt::format("{} host {}", short_name(dtype), to_string(ints));
    }
    case Kind::Bools: {
      std::string s;
      for (size_t i = 0; i < bools.size(); ++i) s += (i ? ", " : "") + bools[i].str();
      return fmt::format("bool host {}[{}]", scalar ? "scalar " : "", s);
    }
    case Kind::Sequence: return fmt::format("sequence of {} tensor(s)", seq.size());
  }
  return "?";
}

}  // namespace protean::onnx::detail
