#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "capture/module_trace.h"
#include "core/device_copy.h"
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
Module& Module::to(Device device) {
  Slots s;
  collect("", s);
  // One copy per storage, so members that shared a storage share its copy.
  std::map<const Storage*, std::shared_ptr<Storage>> moved;
  std::vector<TensorImpl*> impls;
  for (const auto& [name, t] : s.tensors) {
    if (!t->defined()) continue;
    if (t->is_fake())
      throw ValueError(fmt::format("Module::to({}): member '{}' is a capture-time FakeTensor; move the module "
                                   "outside the compiled function",
                                   device.str(), name));
    TensorImpl* impl = t->impl();
    if (impl->device == device || std::find(impls.begin(), impls.end(), impl) != impls.end()) continue;
    impls.push_back(impl);
    const Storage* src = impl->storage.get();
    if (!moved.count(src)) {
      auto dst = std::make_shared<Storage>(src->nbytes(), device);
      core::copy_storage_bytes(*dst, 0, *src, 0, src->nbytes());
      moved.emplace(src, std::move(dst));
    }
  }
  for (TensorImpl* impl : impls) {
    impl->storage = moved.at(impl->storage.get());
    impl->device = device;
  }
  return *this;
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
std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> r;
  std::set<const TensorImpl*> seen;
  for (auto& [n, t] : named_parameters())
    if (!t.defined() || seen.insert(t.impl()).second) r.push_back(t);
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
