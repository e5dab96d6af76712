#include <fmt/format.h>

#include <algorithm>

#include "capture/module_trace.h"
#include "protean/module.h"

namespace protean {

namespace capture {
namespace {
thread_local AttributeReader* t_reader = nullptr;
}
AttributeReader* current_attribute_reader() { return t_reader; }
AttributeReaderScope::AttributeReaderScope(AttributeReader* r) : prev_(t_reader) { t_reader = r; }
AttributeReaderScope::~AttributeReaderScope() { t_reader = prev_; }
}  // namespace capture

void Module::check_new_name(const std::string& name) const {
  if (name.empty()) throw ValueError("Module: member name must not be empty");
  if (name.find('.') != std::string::npos)
    throw ValueError(fmt::format("Module: member name '{}' must not contain '.'", name));
  auto taken = [&](const auto& list) {
    for (const auto& [n, v] : list)
      if (n == name) return true;
    return false;
  };
  if (taken(params_) || taken(buffers_) || taken(attrs_) || taken(children_))
    throw ValueError(fmt::format("Module: '{}' is already registered", name));
}

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name);
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}
Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}
void Module::register_attribute(const std::string& name, int64_t value) {
  check_new_name(name);
  attrs_.emplace_back(name, value);
}
void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  if (!m) throw ValueError(fmt::format("Module: child '{}' is null", name));
  children_.emplace_back(name, std::move(m));
}

SymInt Module::attribute(const std::string& name) const {
  for (const auto& [n, v] : attrs_)
    if (n == name) {
      if (auto* r = capture::current_attribute_reader()) return r->read_attribute(this, name, v);
      return SymInt(v);
    }
  throw ValueError(fmt::format("Module: no attribute '{}'", name));
}
void Module::mark_static(const std::string& name) {
  for (const auto& [n, v] : attrs_)
    if (n == name) {
      if (!attribute_is_static(name)) static_attrs_.push_back(name);
      return;
    }
  throw ValueError(fmt::format("Module::mark_static: no attribute '{}'", name));
}
bool Module::attribute_is_static(const std::string& name) const {
  return std::find(static_attrs_.begin(), static_attrs_.end(), name) != static_attrs_.end();
}
void Module::set_attribute(const std::string& name, int64_t value) {
  for (auto& [n, v] : attrs_)
    if (n == name) {
      v = value;
      return;
    }
  throw ValueError(fmt::format("Module: no attribute '{}'", name));
}

void Module::collect(const std::string& prefix, Slots& out) const {
  for (const auto& [n, t] : params_) out.tensors.emplace_back(prefix + n, &t);
  for (const auto& [n, t] : buffers_) out.tensors.emplace_back(prefix + n, &t);
  for (const auto& [n, v] : attrs_) out.attributes.emplace_back(prefix + n, &v);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", out);
}
Module::Slots Module::slots() const {
  Slots s;
  collect("", s);
  return s;
}


std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> r;
  for (const auto& [n, t] : params_) r.emplace_back(n, t);
  for (const auto& [cn, c] : children_)
    for (auto& [n, t] : c->named_parameters()) r.emplace_back(cn + "." + n, t);
  return r;
}
std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> r;
  for (const auto& [n, t] : buffers_) r.emplace_back(n, t);
  for (const auto& [cn, c] : children_)
    for (auto& [n, t] : c->named_buffers()) r.emplace_back(cn + "." + n, t);
  return r;
}
std::vector<std::pair<std::string, int64_t>> Module::named_attributes() const {
  std::vector<std::pair<std::string, int64_t>> r(attrs_.begin(), attrs_.end());
  for (const auto& [cn, c] : children_)
    for (auto& [n, v] : c->named_attributes()) r.emplace_back(cn + "." + n, v);
  return r;
}
std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

}  // namespace protean
