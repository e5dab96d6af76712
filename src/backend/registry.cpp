#include "backend/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

namespace protean::backend {

std::unique_ptr<Artifact> make_eager_artifact(const BackendInput& in);  // eager/eager.cpp
std::unique_ptr<Artifact> make_interp_artifact(const BackendInput& in);  // eager/interp_adapter.cpp

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
  std::map<std::string, BackendFactory> async_factories;
  std::map<std::string, OpSupport> supports;
  Registry() {
    factories["eager"] = make_eager_artifact;
    factories["interp"] = make_interp_artifact;
  }
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_backend(const std::string& name, BackendFactory factory, OpSupport supports) {
  if (name.empty()) throw ValueError("register_backend: the backend name is empty");
  if (!factory) throw ValueError(fmt::format("register_backend('{}'): the factory is empty", name));
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
  if (supports) r.supports[name] = std::move(supports);
  else r.supports.erase(name);
}

OpSupport op_support(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.supports.find(name);
  return it == r.supports.end() ? OpSupport{} : it->second;
}

namespace {
std::vector<DType> input_dtypes(const ir::Graph& g, const ir::Node& n) {
  std::vector<DType> r;
  for (ir::ValueId v : n.inputs)
    if (v != ir::kNoValue) r.push_back(g.value(v).dtype);
  return r;
}
std::string call_text(const ir::Graph& g, const ir::Node& n) {
  std::string s = fmt::format("{}(", ops::op_name(n.op));
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (i) s += ", ";
    if (n.inputs[i] == ir::kNoValue) {
      s += "None";
      continue;
    }
    const ir::Value& v = g.value(n.inputs[i]);
    s += fmt::format("{}{}", short_name(v.dtype), to_string(v.sizes));
  }
  return s + ")";
}
}  // namespace

UnsupportedOpError::UnsupportedOpError(const ir::Graph& g, const ir::Node& n, std::string why_)
    : CompileError(fmt::format("the backend cannot run {} of graph '{}': {} (at {})", call_text(g, n), g.name, why_,
                                n.loc.str())),
      op(n.op),
      dtypes(input_dtypes(g, n)),
      call(call_text(g, n)),
      why(std::move(why_)),
      loc(n.loc) {}

bool has_backend(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.count(name) != 0;
}

std::vector<std::string> registered_backends() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

std::string auto_backend(Device device) {
  switch (device.type) {
    case DeviceType::CUDA:
      return has_backend("cuda") ? "cuda" : "interp";  // the cpu backend's kernels read host memory
    case DeviceType::CPU:
      break;
  }
  return has_backend("cpu") ? "cpu" : "interp";
}

void check_backend(const std::string& name) {
  if (name == "auto") return;
  if (!has_backend(name))
    throw ValueError(fmt::format("unknown backend '{}'; registered backends: {}", name,
                                 fmt::join(registered_backends(), ", ")));
}

std::unique_ptr<Artifact> make_artifact(const std::string& name, const BackendInput& input) {
  BackendFactory f;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) f = it->second;
  }
  if (!f) check_backend(name);
  return f(input);
}

void register_async_backend(const std::string& name, BackendFactory factory) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.async_factories[name] = std::move(factory);
}

std::unique_ptr<Artifact> make_artifact_async(const std::string& name, const BackendInput& input) {
  BackendFactory f;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.async_factories.find(name);
    if (it != r.async_factories.end()) f = it->second;
  }
  return f ? f(input) : make_artifact(name, input);
}

}  // namespace protean::backend
