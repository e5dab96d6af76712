// The op registry: OpKind (generated from ops.def), per-op info, attributes, and the meta / eager
// kernel tables that every op call goes through (see dispatch.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protean/tensor.h"

namespace protean::ops {

enum class OpKind : uint16_t {
#define PT_OP(name, inputs, outputs, category, flags) name,
#include "ops/ops.def"
};
inline constexpr size_t kNumOps = 0
#define PT_OP(name, inputs, outputs, category, flags) +1
#include "ops/ops.def"
    ;

enum class OpCategory : uint8_t {
  Pointwise, Reduction, Normalization, Linear, Conv, Pool, Resize, View, Movement, Indexing, Scan,
  Attention, Recurrent, Factory, DataDependent, ControlFlow
};
enum OpFlag : uint32_t {
  kNone = 0,
  kView = 1u << 0,                 // output aliases input 0
  kDataDependentShape = 1u << 1,   // output sizes depend on input values
  kExtern = 1u << 2,               // library kernel (oneDNN / OpenBLAS)
  kRandom = 1u << 3,
  kUnbackedSymbol = 1u << 4,       // under capture, defines an unbacked symbol (keep, never merge)
};

struct OpInfo {
  std::string_view name;
  int inputs;   // -1 = variadic
  int outputs;  // -1 = decided by attributes
  OpCategory category;
  uint32_t flags;
};
const OpInfo& op_info(OpKind op);
inline std::string_view op_name(OpKind op) { return op_info(op).name; }
std::optional<OpKind> op_from_name(std::string_view name);
std::string_view category_name(OpCategory c);

// ---- attributes -----------------------------------------------------------------------------------
/// An attribute value. Integers are SymInts so shapes computed from symbolic sizes stay symbolic.
using AttrValue = std::variant<SymInt, SymIntVec, double, bool, std::string, DType>;
struct Attr {
  std::string name;
  AttrValue value;
};

/// Named attributes of an op call, in insertion order (the IR prints them in this order).
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<Attr> init) : items_(init) {}
  Attrs& set(std::string name, AttrValue v);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  const AttrValue* find(std::string_view name) const;
  const std::vector<Attr>& items() const { return items_; }
  std::vector<Attr>& items() { return items_; }
  bool empty() const { return items_.empty(); }

  // Typed getters: throw ValueError("op attribute 'x' missing / has wrong kind") on mismatch.
  SymInt sym_int(std::string_view name) const;
  /// Concrete integer (guards/specializes when symbolic).
  int64_t i(std::string_view name) const { return sym_int(name).guard_int(); }
  const SymIntVec& sym_ints(std::string_view name) const;
  IntVec ints(std::string_view name) const;
  double f(std::string_view name) const;
  bool b(std::string_view name) const;
  const std::string& s(std::string_view name) const;
  DType dtype(std::string_view name) const;
  std::optional<int64_t> opt_i(std::string_view name) const;
  std::optional<double> opt_f(std::string_view name) const;
  std::optional<DType> opt_dtype(std::string_view name) const;

  bool operator==(const Attrs& o) const;

 private:
  std::vector<Attr> items_;
};
/// IR text of a value: `3`, `s0`, `[1, s0]`, `1e-05`, `true`, `"tanh"`, `f32`.
std::string attr_to_string(const AttrValue& v);

// ---- meta functions and eager kernels -----------------------------------------------------------------
/// Computes output metadata from input metadata only (never reads data), validating the call. Must
/// work on symbolic sizes: use SymInt arithmetic and comparisons (a comparison that is turned into a
/// C++ bool adds a guard during capture, which is the intended semantics).
using MetaFn = std::vector<TensorMeta> (*)(std::span<const Tensor> in, const Attrs& attrs);
/// Computes outputs on real CPU tensors. `out` is what the meta function returned for this call;
/// kernels allocate outputs with those sizes/strides (or alias input 0 for view ops).
using KernelFn = std::vector<Tensor> (*)(std::span<const Tensor> in, const Attrs& attrs,
                                          std::span<const TensorMeta> out);

/// Registers implementations (called from static initializers via PROTEAN_REGISTER_OP).
void register_meta(OpKind op, MetaFn fn);
void register_kernel(OpKind op, KernelFn fn);
MetaFn meta_fn(OpKind op);      // nullptr when not registered
KernelFn kernel_fn(OpKind op);  // nullptr when not registered

/// Runs `op`'s meta function (NotImplementedError when missing) and checks the input count.
std::vector<TensorMeta> run_meta(OpKind op, std::span<const Tensor> in, const Attrs& attrs);
/// Runs the eager kernel on real tensors (meta first, for validation and output metadata).
std::vector<Tensor> run_eager(OpKind op, std::span<const Tensor> in, const Attrs& attrs);

/// Allocates a real tensor for `m` (contiguous or with m's strides). While an OutputPlacementScope
/// is active on the calling thread, a contiguous `m` with the dtype and the element count of a place
/// not yet taken gets that place's memory instead (the place is then taken).
Tensor empty_like_meta(const TensorMeta& m);

/// Memory a caller sets aside for an op's result: `data` holds at least numel(sizes) elements of
/// `dtype`, row-major. The cpu backend's runner hands an extern step the memory slot its buffer plan
/// gave the step's output (src/backend/cpu/runner.cpp), so the kernel's output is not a fresh
/// allocation on every call. `data` becomes nullptr once empty_like_meta has taken the place.
struct OutputPlace {
  void* data = nullptr;
  IntVec sizes;
  DType dtype = DType::F32;
};
/// RAII: makes `places` the output places of the calling thread for the scope (nesting restores the
/// previous ones). The caller guarantees that nothing live overlaps the places while the scope is
/// active: any allocation of the op — its result or a temporary of the same shape — may land there.
class OutputPlacementScope {
 public:
  explicit OutputPlacementScope(std::span<OutputPlace> places);
  ~OutputPlacementScope();
  OutputPlacementScope(const OutputPlacementScope&) = delete;
  OutputPlacementScope& operator=(const OutputPlacementScope&) = delete;

 private:
  std::span<OutputPlace>* prev_;
  std::span<OutputPlace> places_;
};
/// Makes a view of `base`'s storage with `m`'s sizes/strides/offset.
Tensor make_view(const Tensor& base, const TensorMeta& m);

/// "add(f32[2, 3], f32[3])" — op name and input shapes/dtypes, for error messages.
std::string describe_call(OpKind op, std::span<const Tensor> in);

}  // namespace protean::ops

#define PROTEAN_OPS_CONCAT2(a, b) a##b
#define PROTEAN_OPS_CONCAT(a, b) PROTEAN_OPS_CONCAT2(a, b)
/// Registers meta and kernel functions for an op at load time:
///   PROTEAN_REGISTER_OP(add, meta_binary, kernel_add);
#define PROTEAN_REGISTER_OP(NAME, META, KERNEL)                                                    \
  static const bool PROTEAN_OPS_CONCAT(protean_registered_, NAME) = [] {                           \
    ::protean::ops::register_meta(::protean::ops::OpKind::NAME, META);                             \
    ::protean::ops::register_kernel(::protean::ops::OpKind::NAME, KERNEL);                         \
    return true;                                                                                   \
  }()
