// For EVERY op in ops.def: a representative random call whose run_meta output metadata must equal the
// eager output's (sizes and dtype; for view ops also strides, storage offset and storage aliasing).
// An op without a meta function, a kernel, or a case in this file fails the test with the list of
// such ops, so a new row in ops.def cannot go unchecked (control-flow ops excepted: see below).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>

#include "ops/registry.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::SymIntVec;
using pt::Tensor;
using pt::ops::Attrs;

namespace {

struct Call {
  std::vector<Tensor> in;
  Attrs attrs;
};

std::mt19937& rng() {
  static std::mt19937 g(2024);
  return g;
}
int64_t rnd(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng()); }

/// Random values in [lo, hi) as f64, converted to `dt`.
Tensor rnd_t(const IntVec& sizes, DType dt = DType::F32, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng());
  Tensor t = pt::tensor<double>(v, sizes);
  return dt == DType::F64 ? t : t.to(dt);
}
Tensor idx_t(int64_t hi, const IntVec& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = rnd(0, hi - 1);
  return pt::tensor<int64_t>(v, sizes);
}
SymIntVec sv(const IntVec& v) { return pt::to_symint_vec(v); }

/// One representative call per op name (attributes named as in src/ops/api.cpp).
std::map<std::string, std::function<Call()>> cases() {
  std::map<std::string, std::function<Call()>> c;
  auto unary = [](double lo, double hi) {
    return [lo, hi] { return Call{{pt::transpose(rnd_t({rnd(1, 4), 3}, DType::F32, lo, hi), 0, 1)}, {}}; };
  };
  for (const char* n : {"abs", "ceil", "cos", "erf", "exp", "floor", "hardsigmoid", "hardswish", "neg", "reciprocal",
                        "relu", "round", "sigmoid", "sign", "silu", "sin", "tanh"})
    c[n] = unary(-2, 2);
  for (const char* n : {"log", "rsqrt", "sqrt"}) c[n] = unary(0.5, 2);
  c["logical_not"] = [] { return Call{{rnd_t({2, 3}).to(DType::Bool)}, {}}; };
  c["gelu"] = [] { return Call{{rnd_t({2, 5})}, {{"approximate", std::string("tanh")}}}; };
  c["clamp"] = [] { return Call{{rnd_t({4, 2})}, {{"min", -0.5}, {"max", 0.5}}}; };
  c["cast"] = [] { return Call{{rnd_t({3, 2})}, {{"dtype", DType::F16}}}; };
  for (const char* n : {"add", "div", "eq", "ge", "gt", "le", "lt", "maximum", "minimum", "mul", "ne", "sub"})
    c[n] = [] { return Call{{rnd_t({3, 1, 4}), rnd_t({rnd(1, 5), 4}, DType::F64)}, {}}; };
  c["pow"] = [] { return Call{{rnd_t({3, 1, 4}, DType::F32, 0.5, 2), rnd_t({2, 4})}, {}}; };
  for (const char* n : {"logical_and", "logical_or"})
    c[n] = [] { return Call{{rnd_t({3, 4}).to(DType::Bool), rnd_t({4}).to(DType::Bool)}, {}}; };
  c["where"] = [] { return Call{{rnd_t({3, 4}).to(DType::Bool), rnd_t({3, 4}), rnd_t({4}, DType::F64)}, {}}; };
  for (const char* n : {"amax", "amin", "mean", "prod", "sum"})
    c[n] = [] { return Call{{rnd_t({3, rnd(1, 5), 2})}, {{"dims", sv({1})}, {"keepdim", rnd(0, 1) == 1}}}; };
  c["var"] = [] {
    return Call{{rnd_t({3, 4, 2})}, {{"dims", sv({0, 2})}, {"keepdim", false}, {"correction", pt::SymInt(1)}}};
  };
  c["argmax"] = [] { return Call{{rnd_t({3, 4})}, {{"dim", pt::SymInt(1)}, {"keepdim", true}}}; };
  c["batch_norm"] = [] {
    return Call{{rnd_t({2, 3, 4, 4}), rnd_t({3}), rnd_t({3}), rnd_t({3}), rnd_t({3}, DType::F32, 0.5, 1)},
                {{"eps", 1e-5}}};
  };
  // training-mode batch norm: stats and sums are f64 [2, C]; a 3-D x with an odd channel count
  c["batch_norm_stats"] = [] { return Call{{rnd_t({3, 5, 7})}, {}}; };
  c["batch_norm_train_apply"] = [] {
    return Call{{rnd_t({3, 5, 7}), rnd_t({2, 5}, DType::F64, 0.5, 1), rnd_t({5}), rnd_t({5})}, {{"eps", 1e-5}}};
  };
  c["batch_norm_train_grad_sums"] = [] {
    return Call{{rnd_t({3, 5, 7}), rnd_t({3, 5, 7}), rnd_t({2, 5}, DType::F64, 0.5, 1)}, {{"eps", 1e-5}}};
  };
  c["batch_norm_train_backward"] = [] {
    return Call{{rnd_t({3, 5, 7}), rnd_t({3, 5, 7}), rnd_t({2, 5}, DType::F64, 0.5, 1), rnd_t({2, 5}, DType::F64),
                 rnd_t({5})},
                {{"eps", 1e-5}}};
  };
  c["group_norm"] = [] {
    return Call{{rnd_t({2, 4, 3}), rnd_t({4}), rnd_t({4})}, {{"groups", pt::SymInt(2)}, {"eps", 1e-5}}};
  };
  c["layer_norm"] = [] {
    return Call{{rnd_t({2, 3, 4}), rnd_t({4}), rnd_t({4})}, {{"normalized_shape", sv({4})}, {"eps", 1e-5}}};
  };
  c["rms_norm"] = [] {
    return Call{{rnd_t({2, 3, 4}), rnd_t({3, 4})}, {{"normalized_shape", sv({3, 4})}, {"eps", 1e-6}}};
  };
  c["softmax"] = [] { return Call{{rnd_t({2, 5})}, {{"dim", pt::SymInt(-1)}}}; };
  c["log_softmax"] = [] { return Call{{rnd_t({2, 5})}, {{"dim", pt::SymInt(0)}}}; };
  c["bmm"] = [] { return Call{{rnd_t({2, 3, 4}), rnd_t({2, 4, 5})}, {}}; };
  c["linear"] = [] { return Call{{rnd_t({rnd(1, 3), 3, 4}), rnd_t({5, 4}), rnd_t({5})}, {}}; };
  c["matmul"] = [] { return Call{{rnd_t({2, 3, 4}), rnd_t({4, 5})}, {}}; };
  auto conv_attrs = [](int nd, int64_t pad) {
    return Attrs{{"stride", sv(IntVec(static_cast<size_t>(nd), 1))},
                 {"padding", sv(IntVec(static_cast<size_t>(nd), pad))},
                 {"dilation", sv(IntVec(static_cast<size_t>(nd), 1))},
                 {"groups", pt::SymInt(1)}};
  };
  c["conv1d"] = [=] { return Call{{rnd_t({1, 2, 8}), rnd_t({4, 2, 3}), rnd_t({4})}, conv_attrs(1, 1)}; };
  c["conv2d"] = [=] { return Call{{rnd_t({1, 2, 6, 5}), rnd_t({4, 2, 3, 3}), rnd_t({4})}, conv_attrs(2, 1)}; };
  c["conv_transpose2d"] = [] {
    return Call{{rnd_t({1, 2, 4, 4}), rnd_t({2, 3, 3, 3}), rnd_t({3})},
                {{"stride", sv({2, 2})},
                 {"padding", sv({1, 1})},
                 {"output_padding", sv({1, 1})},
                 {"dilation", sv({1, 1})},
                 {"groups", pt::SymInt(1)}}};
  };
  // fused externs: the base call plus operands and a post-op list
  auto with_post = [](Call call, std::vector<Tensor> operands, const char* post) {
    for (Tensor& t : operands) call.in.push_back(t);
    call.attrs.set("post_ops", std::string(post));
    return call;
  };
  c["conv1d_fused"] = [=] {
    return with_post(Call{{rnd_t({1, 2, 8}), rnd_t({4, 2, 3}), rnd_t({4})}, conv_attrs(1, 1)}, {rnd_t({4, 1})},
                     "mul(#3), hardswish");
  };
  c["conv2d_fused"] = [=] {
    return with_post(Call{{rnd_t({1, 2, 6, 5}), rnd_t({4, 2, 3, 3}), Tensor()}, conv_attrs(2, 1)},
                     {rnd_t({1, 4, 6, 5})}, "add(#3), relu");
  };
  c["conv_transpose2d_fused"] = [] {
    return Call{{rnd_t({1, 2, 4, 4}), rnd_t({2, 3, 3, 3}), rnd_t({3})},
                {{"stride", sv({2, 2})},
                 {"padding", sv({1, 1})},
                 {"output_padding", sv({1, 1})},
                 {"dilation", sv({1, 1})},
                 {"groups", pt::SymInt(1)},
                 {"post_ops", std::string("sigmoid")}}};
  };
  c["linear_fused"] = [=] {
    return with_post(Call{{rnd_t({rnd(1, 3), 3, 4}), rnd_t({5, 4}), rnd_t({5})}, {}}, {rnd_t({5})},
                     "swish(1), mul(#3)");
  };
  c["matmul_fused"] = [=] {
    return with_post(Call{{rnd_t({2, 3, 4}), rnd_t({4, 5})}, {}}, {rnd_t({5}), rnd_t({2, 3, 5})},
                     "add(#2), gelu_tanh, add(#3)");
  };
  c["adaptive_avg_pool2d"] = [] { return Call{{rnd_t({1, 2, 5, 5})}, {{"output_size", sv({2, 3})}}}; };
  c["avg_pool2d"] = [] {
    return Call{{rnd_t({1, 2, 6, 6})},
                {{"kernel_size", sv({2, 2})},
                 {"stride", sv({2, 2})},
                 {"padding", sv({0, 0})},
                 {"ceil_mode", false},
                 {"count_include_pad", true}}};
  };
  c["max_pool2d"] = [] {
    return Call{{rnd_t({1, 2, 7, 7})},
                {{"kernel_size", sv({3, 3})},
                 {"stride", sv({2, 2})},
                 {"padding", sv({1, 1})},
                 {"dilation", sv({1, 1})},
                 {"ceil_mode", false}}};
  };
  c["pad"] = [] {
    return Call{{rnd_t({2, 3, 5})}, {{"pads", sv({1, 2})}, {"mode", std::string("reflect")}, {"value", 0.0}}};
  };
  c["upsample_bilinear2d"] = [] {
    return Call{{rnd_t({1, 2, 3, 4})}, {{"output_size", sv({7, 9})}, {"align_corners", false}}};
  };
  c["upsample_nearest2d"] = [] { return Call{{rnd_t({1, 2, 3, 4})}, {{"output_size", sv({6, 5})}}}; };
  // views: non-contiguous bases with offsets, so strides/offsets are a real check
  auto base = [] { return pt::slice(pt::transpose(rnd_t({5, 4, 3}), 0, 2), 1, 1, 4); };  // [3, 3, 5]
  c["expand"] = [] { return Call{{rnd_t({3, 1})}, {{"sizes", sv({2, -1, 4})}}}; };
  c["permute"] = [=] { return Call{{base()}, {{"dims", sv({2, 0, 1})}}}; };
  c["reshape"] = [=] { return Call{{base()}, {{"shape", sv({9, -1})}}}; };
  c["select"] = [=] { return Call{{base()}, {{"dim", pt::SymInt(1)}, {"index", pt::SymInt(-1)}}}; };
  c["slice"] = [=] {
    return Call{{base()}, {{"dim", pt::SymInt(2)}, {"start", pt::SymInt(1)}, {"end", pt::SymInt(100)},
                           {"step", pt::SymInt(2)}}};
  };
  c["squeeze"] = [] { return Call{{pt::slice(rnd_t({3, 1, 4}), 2, 1, 2)}, {{"dims", sv({})}}}; };
  c["unsqueeze"] = [=] { return Call{{base()}, {{"dim", pt::SymInt(-1)}}}; };
  c["view"] = [] { return Call{{pt::slice(rnd_t({6, 4}), 0, 2, 5)}, {{"shape", sv({2, 3, 2})}}}; };
  c["cat"] = [] { return Call{{rnd_t({2, 3}), rnd_t({2, rnd(0, 4)}, DType::F64)}, {{"dim", pt::SymInt(1)}}}; };
  c["clone"] = [=] { return Call{{base()}, {}}; };
  c["split"] = [=] { return Call{{base()}, {{"dim", pt::SymInt(2)}, {"sizes", sv({2, 0, 3})}}}; };
  c["stack"] = [] { return Call{{rnd_t({2, 3}), rnd_t({2, 3})}, {{"dim", pt::SymInt(-1)}}}; };
  c["embedding"] = [] { return Call{{rnd_t({10, 4}), idx_t(10, {2, 3})}, {}}; };
  c["gather"] = [] { return Call{{rnd_t({3, 4}), idx_t(4, {3, 6})}, {{"dim", pt::SymInt(1)}}}; };
  c["index_select"] = [] { return Call{{rnd_t({3, 4}), idx_t(3, {5})}, {{"dim", pt::SymInt(0)}}}; };
  c["index_add"] = [] {
    return Call{{rnd_t({3, 4}), idx_t(3, {5}), rnd_t({5, 4})}, {{"dim", pt::SymInt(0)}}};
  };
  c["scatter_add"] = [] {
    return Call{{rnd_t({3, 4}), idx_t(4, {3, 2}), rnd_t({3, 5})}, {{"dim", pt::SymInt(1)}}};
  };
  c["max_pool2d_backward"] = [] {
    return Call{{rnd_t({1, 2, 4, 4}), rnd_t({1, 2, 7, 7})},
                {{"kernel_size", sv({3, 3})}, {"stride", sv({2, 2})}, {"padding", sv({1, 1})},
                 {"dilation", sv({1, 1})}, {"ceil_mode", false}}};
  };
  c["avg_pool2d_backward"] = [] {
    return Call{{rnd_t({1, 2, 3, 3}), rnd_t({1, 2, 7, 7})},
                {{"kernel_size", sv({3, 3})}, {"stride", sv({2, 2})}, {"padding", sv({0, 0})},
                 {"ceil_mode", false}, {"count_include_pad", true}}};
  };
  // x [2, 4, 7, 6], w [6, 2, 3, 2], stride (2, 1), padding (1, 0), dilation (1, 2), groups 2 → g [2, 6, 4, 4]
  auto conv_backward_attrs = [](const char* size_name, IntVec size) {
    return Attrs{{size_name, sv(size)}, {"stride", sv({2, 1})}, {"padding", sv({1, 0})},
                 {"dilation", sv({1, 2})}, {"groups", pt::SymInt(2)}};
  };
  c["conv2d_backward_input"] = [=] {
    return Call{{rnd_t({2, 6, 4, 4}), rnd_t({6, 2, 3, 2})}, conv_backward_attrs("input_size", {7, 6})};
  };
  c["conv2d_backward_weight"] = [=] {
    return Call{{rnd_t({2, 6, 4, 4}), rnd_t({2, 4, 7, 6})}, conv_backward_attrs("kernel_size", {3, 2})};
  };
  c["adaptive_avg_pool2d_backward"] = [] {
    return Call{{rnd_t({1, 2, 3, 2}), rnd_t({1, 2, 7, 5})}, {{"output_size", sv({3, 2})}}};
  };
  c["philox_uniform"] = [] {
    return Call{{}, {{"shape", sv({2, 3})}, {"seed", pt::SymInt(7)}, {"offset", pt::SymInt(11)}, {"dtype", DType::F32}}};
  };
  c["cumsum"] = [] { return Call{{rnd_t({3, 4}).to(DType::I32)}, {{"dim", pt::SymInt(1)}}}; };
  c["scaled_dot_product_attention"] = [] {
    return Call{{rnd_t({2, 3, 4}), rnd_t({2, 5, 4}), rnd_t({2, 5, 6}), Tensor()}, {{"is_causal", true}}};
  };
  c["scaled_dot_product_attention_backward"] = [] {
    return Call{{rnd_t({2, 3, 5, 4}), rnd_t({2, 3, 5, 4}), rnd_t({2, 3, 5, 4}), rnd_t({2, 3, 5, 4})},
                {{"is_causal", true}, {"scale", 0.4}}};
  };
  c["lstm"] = [] {
    int64_t H = 3, D = 2;
    return Call{{rnd_t({4, 2, 5}), rnd_t({D, 4 * H, 5}), rnd_t({D, 4 * H, H}), rnd_t({D, 8 * H}), Tensor(),
                 rnd_t({D, 2, H}), rnd_t({D, 2, H}), rnd_t({D, 3 * H})},
                {{"hidden_size", pt::SymInt(H)}, {"direction", std::string("bidirectional")}}};
  };
  for (const char* n : {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"})
    c[n] = [] { return Call{{rnd_t({3, 1, 4}, DType::I32, -50, 50), rnd_t({rnd(1, 5), 4}, DType::I32, 0, 40)}, {}}; };
  c["bitwise_not"] = [] { return Call{{rnd_t({2, 3}, DType::I64, -50, 50)}, {}}; };
  c["linalg_det"] = [] { return Call{{rnd_t({2, rnd(1, 3), 3, 3})}, {}}; };
  c["scatter_reduce"] = [] {
    return Call{{rnd_t({3, 4}), idx_t(4, {3, 2}), rnd_t({3, 5})},
                {{"dim", pt::SymInt(1)}, {"reduce", std::string("prod")}, {"include_self", false}}};
  };
  c["arange"] = [] {
    return Call{{}, {{"start", pt::SymInt(2)}, {"end", pt::SymInt(11)}, {"step", pt::SymInt(3)}, {"dtype", DType::I64}}};
  };
  c["full"] = [] { return Call{{}, {{"shape", sv({2, 3})}, {"value", 1.5}, {"dtype", DType::F16}}}; };
  c["nonzero"] = [] { return Call{{rnd_t({3, 4}).to(DType::Bool)}, {}}; };
  c["local_scalar_dense"] = [] { return Call{{pt::tensor<int64_t>({-7}, {1, 1})}, {{"symbol", pt::SymInt(0)}}}; };
  return c;
}

const std::vector<std::string>& all_op_names() {
  static const std::vector<std::string> names = {
#define PT_OP(name, inputs, outputs, category, flags) #name,
#include "ops/ops.def"
  };
  return names;
}

}  // namespace

TEST(OpsMetaConsistency, EveryOpMetaMatchesEager) {
  auto table = cases();
  std::vector<std::string> missing;
  int checked = 0;
  for (const std::string& name : all_op_names()) {
    auto op = pt::ops::op_from_name(name);
    ASSERT_TRUE(op.has_value()) << name;
    // Control flow (cond) has neither: its types and execution live in the node's subgraphs
    // (ops_cond_test.cpp, ir_cond_test.cpp).
    if (pt::ops::op_info(*op).category == pt::ops::OpCategory::ControlFlow) continue;
    if (!pt::ops::meta_fn(*op)) {
      missing.push_back(name + " (no meta)");
      continue;
    }
    if (!pt::ops::kernel_fn(*op)) {
      missing.push_back(name + " (no kernel)");
      continue;
    }
    auto it = table.find(name);
    if (it == table.end()) {
      missing.push_back(name + " (no case in this test)");
      continue;
    }
    const bool view_category = pt::ops::op_info(*op).category == pt::ops::OpCategory::View;
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE(name + " call " + std::to_string(rep));
      Call call = it->second();
      std::vector<pt::TensorMeta> metas;
      std::vector<Tensor> outs;
      try {
        metas = pt::ops::run_meta(*op, call.in, call.attrs);
        outs = pt::ops::run_eager(*op, call.in, call.attrs);
      } catch (const pt::NotImplementedError& e) {
        missing.push_back(name + " (" + e.what() + ")");
        break;
      } catch (const std::exception& e) {
        ADD_FAILURE() << pt::ops::describe_call(*op, call.in) << " threw: " << e.what();
        break;
      }
      ASSERT_EQ(metas.size(), outs.size()) << name;
      for (size_t i = 0; i < outs.size(); ++i) {
        EXPECT_EQ(pt::to_string(metas[i].sizes), pt::to_string(outs[i].sizes())) << name << " output " << i;
        EXPECT_EQ(metas[i].dtype, outs[i].dtype()) << name << " output " << i;
        EXPECT_EQ(metas[i].device, outs[i].device()) << name << " output " << i;
        // View-category ops and any output the meta marks as an alias (split) are checked as views.
        if (view_category || metas[i].alias_of >= 0) {
          EXPECT_EQ(pt::to_string(metas[i].strides), pt::to_string(outs[i].strides())) << name << " output " << i;
          EXPECT_EQ(metas[i].storage_offset.hint(), outs[i].storage_offset().hint()) << name << " output " << i;
          const bool aliases = outs[i].impl()->storage == call.in[0].impl()->storage;
          EXPECT_LE(metas[i].alias_of, 0) << name << ": only input 0 can be aliased";
          EXPECT_EQ(metas[i].alias_of == 0, aliases) << name << " output " << i << ": meta alias_of "
                                                     << metas[i].alias_of << " but eager "
                                                     << (aliases ? "aliases" : "copies");
        } else {
          for (const auto& t : call.in) {
            if (t.defined()) {
              EXPECT_NE(outs[i].impl()->storage, t.impl()->storage) << name << " output aliases an input";
            }
          }
        }
      }
      ++checked;
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += "\n  " + m;
    FAIL() << missing.size() << " op(s) of ops.def cannot be checked (missing meta, kernel or test case):" << list;
  }
  EXPECT_GT(checked, 0);
}

TEST(OpsMetaConsistency, TableCoversExactlyTheOps) {
  // A case for an op that no longer exists in ops.def is a stale test.
  auto table = cases();
  for (const auto& [name, fn] : table)
    EXPECT_TRUE(pt::ops::op_from_name(name).has_value()) << "case for unknown op " << name;
}
