// Helpers for the ONNX importer tests: build small ModelProtos in C++ and load them.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "protean/onnx.h"
#include "protean/ops.h"

namespace protean::onnx_test {

/// Builds a single-graph ModelProto (default domain at `opset`).
class Builder {
 public:
  explicit Builder(int64_t opset = 13, const std::string& graph_name = "test_graph") {
    m_.set_ir_version(8);
    m_.set_producer_name("protean-test");
    auto* os = m_.add_opset_import();
    os->set_domain("");
    os->set_version(opset);
    g_ = m_.mutable_graph();
    g_->set_name(graph_name);
  }
  ::onnx::GraphProto* graph() { return g_; }
  ::onnx::ModelProto& model() { return m_; }

  /// dims: >= 0 static, -1 dynamic (named by `params[i]` if given).
  static void set_type(::onnx::ValueInfoProto* vi, const std::string& name, int32_t elem, const std::vector<int64_t>& dims,
                       const std::vector<std::string>& params = {}) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* sh = tt->mutable_shape();
    for (size_t i = 0; i < dims.size(); ++i) {
      auto* d = sh->add_dim();
      if (dims[i] >= 0) d->set_dim_value(dims[i]);
      else if (i < params.size()) d->set_dim_param(params[i]);
    }
  }
  Builder& input(const std::string& name, int32_t elem, const std::vector<int64_t>& dims,
                 const std::vector<std::string>& params = {}) {
    set_type(g_->add_input(), name, elem, dims, params);
    return *this;
  }
  Builder& output(const std::string& name) {
    g_->add_output()->set_name(name);
    return *this;
  }
  static ::onnx::NodeProto* add_node(::onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& in,
                                     const std::vector<std::string>& out, const std::string& name = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? op + "_" + std::to_string(g->node_size()) : name);
    for (const auto& i : in) n->add_input(i);
    for (const auto& o : out) n->add_output(o);
    return n;
  }
  ::onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& in,
                          const std::vector<std::string>& out, const std::string& name = "") {
    return add_node(g_, op, in, out, name);
  }
  static void fill(::onnx::TensorProto* t, const std::string& name, const std::vector<int64_t>& dims,
                   const std::vector<float>& v) {
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::FLOAT);
    for (auto d : dims) t->add_dims(d);
    for (float x : v) t->add_float_data(x);
  }
  static void fill_i64(::onnx::TensorProto* t, const std::string& name, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& v) {
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::INT64);
    for (auto d : dims) t->add_dims(d);
    for (auto x : v) t->add_int64_data(x);
  }
  /// A float initializer.
  Builder& init(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    fill(g_->add_initializer(), name, dims, v);
    return *this;
  }
  /// An int64 Constant node (dims empty = scalar).
  static void const_i64(::onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& v,
                        std::vector<int64_t> dims = {-2}) {
    if (dims.size() == 1 && dims[0] == -2) dims = {static_cast<int64_t>(v.size())};
    auto* n = add_node(g, "Constant", {}, {name}, "const_" + name);
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    fill_i64(a->mutable_t(), "", dims, v);
  }
  Builder& const_i64(const std::string& name, const std::vector<int64_t>& v, std::vector<int64_t> dims = {-2}) {
    const_i64(g_, name, v, dims);
    return *this;
  }
  /// A float Constant node in graph `g` (a subgraph too).
  static void const_f32_in(::onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims,
                           const std::vector<float>& v) {
    auto* n = add_node(g, "Constant", {}, {name}, "const_" + name);
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    fill(a->mutable_t(), "", dims, v);
  }
  /// A float Constant node.
  Builder& const_f32(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    auto* n = node("Constant", {}, {name}, "const_" + name);
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    fill(a->mutable_t(), "", dims, v);
    return *this;
  }

  static void attr_i(::onnx::NodeProto* n, const std::string& k, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr_f(::onnx::NodeProto* n, const std::string& k, float v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(::onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void attr_s(::onnx::NodeProto* n, const std::string& k, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(::onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  static void attr_ints(::onnx::NodeProto* n, const std::string& k, const std::vector<int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(::onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  static ::onnx::GraphProto* attr_g(::onnx::NodeProto* n, const std::string& k, const std::string& gname) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(::onnx::AttributeProto::GRAPH);
    a->mutable_g()->set_name(gname);
    return a->mutable_g();
  }

  std::string bytes() const { return m_.SerializeAsString(); }
  std::shared_ptr<onnx::Model> load(const onnx::LoadOptions& o = {}) const {
    return onnx::load_from_bytes(bytes(), "test.onnx", o);
  }

 private:
  ::onnx::ModelProto m_;
  ::onnx::GraphProto* g_;
};

inline Tensor ftensor(const std::vector<float>& v, const IntVec& sizes) { return tensor<float>(v, sizes); }

/// Directory of the real models (scripts/fetch_models.sh), or "" when they are not there.
inline std::string models_dir() {
  const char* env = std::getenv("PROTEAN_MODELS_DIR");
  std::string dir = env ? env : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/protean/models";
  return std::filesystem::exists(dir + "/ch_ppocr_mobile_v2.0_cls_infer.onnx") ? dir : "";
}

/// The largest absolute difference of `got` from `ref` (f32 values of equal sizes); infinity when
/// the sizes differ (also a test failure) or a difference is NaN.
inline double max_abs_err(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.int_sizes(), ref.int_sizes());
  if (got.int_sizes() != ref.int_sizes()) return INFINITY;
  std::vector<float> a = got.contiguous().to_vector<float>(), b = ref.to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::abs(double(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace protean::onnx_test

/// Runs `stmt`; an op without a kernel/meta function yet (NotImplementedError from src/ops) skips the test.
#define PROTEAN_ONNX_RUN_OR_SKIP(stmt)                                                                 \
  try {                                                                                                \
    stmt;                                                                                              \
  } catch (const ::protean::NotImplementedError& e) {                                                  \
    std::string w = e.what();                                                                          \
    if (w.find("has no CPU kernel") != std::string::npos || w.find("has no meta function") != std::string::npos) \
      GTEST_SKIP() << "an op this test needs is not implemented yet: " << w;                          \
    throw;                                                                                             \
  }
