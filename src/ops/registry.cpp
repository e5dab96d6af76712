#include "ops/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "core/checked_size.h"
#include "core/device_copy.h"
#include "observe/log.h"
#include "ops/dispatch.h"
#include "ops/tape.h"

namespace protean::ops {

namespace {
constexpr OpInfo kInfos[] = {
#define PT_OP(name, inputs, outputs, category, flags) \
  {#name, inputs, outputs, OpCategory::category, static_cast<uint32_t>(flags)},
#include "ops/ops.def"
};
static_assert(sizeof(kInfos) / sizeof(kInfos[0]) == kNumOps);

std::array<MetaFn, kNumOps>& meta_table() {
  static std::array<MetaFn, kNumOps> t{};
  return t;
}
std::array<KernelFn, kNumOps>& kernel_table() {
  static std::array<KernelFn, kNumOps> t{};
  return t;
}
}  // namespace

const OpInfo& op_info(OpKind op) { return kInfos[static_cast<size_t>(op)]; }

std::optional<OpKind> op_from_name(std::string_view name) {
  for (size_t i = 0; i < kNumOps; ++i)
    if (kInfos[i].name == name) return static_cast<OpKind>(i);
  return std::nullopt;
}

std::string_view category_name(OpCategory c) {
  switch (c) {
    case OpCategory::Pointwise: return "Pointwise";
    case OpCategory::Reduction: return "Reduction";
    case OpCategory::Normalization: return "Normalization";
    case OpCategory::Linear: return "Linear";
    case OpCategory::Conv: return "Conv";
    case OpCategory::Pool: return "Pool";
    case OpCategory::Resize: return "Resize";
    case OpCategory::View: return "View";
    case OpCategory::Movement: return "Movement";
    case OpCategory::Indexing: return "Indexing";
    case OpCategory::Scan: return "Scan";
    case OpCategory::Attention: return "Attention";
    case OpCategory::Recurrent: return "Recurrent";
    case OpCategory::Factory: return "Factory";
    case OpCategory::DataDependent: return "DataDependent";
    case OpCategory::ControlFlow: return "ControlFlow";
  }
  return "?";
}

// ---- Attrs ------------------------------------------------------------------------------------------
Attrs& Attrs::set(std::string name, AttrValue v) {
  for (auto& a : items_)
    if (a.name == name) {
      a.value = std::move(v);
      return *this;
    }
  items_.push_back({std::move(name), std::move(v)});
  return *this;
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& a : items_)
    if (a.name == name) return &a.value;
  return nullptr;
}

namespace {
template <typename T>
const T& get_as(const Attrs& a, std::string_view name, const char* kind) {
  const AttrValue* v = a.find(name);
  if (!v) throw ValueError(fmt::format("op attribute '{}' is missing", name));
  if (const T* p = std::get_if<T>(v)) return *p;
  throw ValueError(fmt::format("op attribute '{}' should be {}, got {}", name, kind, attr_to_string(*v)));
}
}  // namespace

SymInt Attrs::sym_int(std::string_view name) const {
  const AttrValue* v = find(name);
  if (v)
    if (const bool* b = std::get_if<bool>(v)) return SymInt(*b ? 1 : 0);
  return get_as<SymInt>(*this, name, "an int");
}
const SymIntVec& Attrs::sym_ints(std::string_view name) const { return get_as<SymIntVec>(*this, name, "an int list"); }
IntVec Attrs::ints(std::string_view name) const {
  IntVec r;
  for (const auto& s : sym_ints(name)) r.push_back(s.guard_int());
  return r;
}
double Attrs::f(std::string_view name) const {
  const AttrValue* v = find(name);
  if (v)
    if (const SymInt* p = std::get_if<SymInt>(v)) return static_cast<double>(p->guard_int());
  return get_as<double>(*this, name, "a float");
}
bool Attrs::b(std::string_view name) const { return get_as<bool>(*this, name, "a bool"); }
const std::string& Attrs::s(std::string_view name) const { return get_as<std::string>(*this, name, "a string"); }
DType Attrs::dtype(std::string_view name) const { return get_as<DType>(*this, name, "a dtype"); }
std::optional<int64_t> Attrs::opt_i(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  return i(name);
}
std::optional<double> Attrs::opt_f(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  return f(name);
}
std::optional<DType> Attrs::opt_dtype(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  return dtype(name);
}

namespace {
bool same_symint(const SymInt& a, const SymInt& b) {
  return a.is_symbolic() || b.is_symbolic() ? a.expr() == b.expr() : a.hint() == b.hint();
}
bool same_value(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<SymInt>(&a)) return same_symint(*x, std::get<SymInt>(b));
  if (const auto* x = std::get_if<SymIntVec>(&a)) {
    const auto& y = std::get<SymIntVec>(b);
    if (x->size() != y.size()) return false;
    for (size_t i = 0; i < x->size(); ++i)
      if (!same_symint((*x)[i], y[i])) return false;
    return true;
  }
  if (const auto* x = std::get_if<double>(&a)) {
    double y = std::get<double>(b);
    return *x == y || (*x != *x && y != y);
  }
  if (const auto* x = std::get_if<bool>(&a)) return *x == std::get<bool>(b);
  if (const auto* x = std::get_if<std::string>(&a)) return *x == std::get<std::string>(b);
  return std::get<DType>(a) == std::get<DType>(b);
}
}  // namespace

bool Attrs::operator==(const Attrs& o) const {
  if (items_.size() != o.items_.size()) return false;
  for (size_t i = 0; i < items_.size(); ++i)
    if (items_[i].name != o.items_[i].name || !same_value(items_[i].value, o.items_[i].value)) return false;
  return true;
}

std::string attr_to_string(const AttrValue& v) {
  struct V {
    std::string operator()(const SymInt& s) const { return s.str(); }
    std::string operator()(const SymIntVec& s) const { return to_string(s); }
    std::string operator()(double d) const {
      std::string r = fmt::format("{}", d);
      if (r.find_first_of(".eni") == std::string::npos) r += ".0";
      return r;
    }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::string& s) const { return fmt::format("\"{}\"", s); }
    std::string operator()(DType d) const { return std::string(short_name(d)); }
  };
  return std::visit(V{}, v);
}

// ---- tables -----------------------------------------------------------------------------------------
void register_meta(OpKind op, MetaFn fn) { meta_table()[static_cast<size_t>(op)] = fn; }
void register_kernel(OpKind op, KernelFn fn) { kernel_table()[static_cast<size_t>(op)] = fn; }
MetaFn meta_fn(OpKind op) { return meta_table()[static_cast<size_t>(op)]; }
KernelFn kernel_fn(OpKind op) { return kernel_table()[static_cast<size_t>(op)]; }

std::string describe_call(OpKind op, std::span<const Tensor> in) {
  std::string s = fmt::format("{}(", op_name(op));
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    if (!in[i].defined()) {
      s += "None";
      continue;
    }
    s += fmt::format("{}{}", short_name(in[i].dtype()), to_string(in[i].sizes()));
  }
  return s + ")";
}

std::vector<TensorMeta> run_meta(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  const OpInfo& info = op_info(op);
  if (info.inputs >= 0 && static_cast<int>(in.size()) != info.inputs)
    throw ValueError(fmt::format("{}: expected {} tensor inputs, got {}", info.name, info.inputs, in.size()));
  MetaFn fn = meta_fn(op);
  if (!fn) throw NotImplementedError(fmt::format("op '{}' has no meta function", info.name));
  return fn(in, attrs);
}

namespace {
// An eager op on device tensors. View ops whose outputs alias input 0 only rewrite metadata and run as they are: their
// output aliases the device storage; clone of a contiguous tensor is a device-to-device copy. Every other op has no
// device kernel in eager mode: its inputs
// are copied to the host, the CPU kernel runs, and the outputs are copied back (a perf_hints line
// says so; compile the function with backend cuda to keep the work on the device). CPU inputs may be
// mixed in only as 0-dim tensors (PyTorch's CPU-scalar rule).
std::vector<Tensor> run_on_host_copy(OpKind op, std::span<const Tensor> in, const Attrs& attrs, Device dev) {
  for (const auto& t : in)
    if (t.defined() && t.device().type == DeviceType::CPU && t.dim() != 0)
      throw ValueError(fmt::format("{}: expected all tensors to be on the same device, but found at least two devices, "
                                   "{} and cpu (move the cpu tensor with .to(Device{{DeviceType::CUDA, {}}}))",
                                   describe_call(op, in), dev.str(), dev.index));
  if (op_info(op).category == OpCategory::View) {
    std::vector<TensorMeta> metas = run_meta(op, in, attrs);
    bool all_alias = true;
    for (const auto& m : metas) all_alias = all_alias && m.alias_of == 0;
    if (all_alias) {  // a view of input 0 (reshape too, when the strides allow one)
      std::vector<Tensor> outs;
      for (auto& m : metas) {
        m.device = dev;
        outs.push_back(make_view(in[0], m));
      }
      return outs;
    }
  }
  // A copy of one contiguous device tensor (clone): device to device on the device's stream.
  if (op == OpKind::clone && in.size() == 1 && in[0].defined() && in[0].device() == dev && in[0].is_contiguous())
    return {core::copy_of(in[0])};
  std::vector<Tensor> host;
  int64_t bytes = 0;
  for (const auto& t : in) {
    if (t.defined() && t.device() == dev) bytes += t.int_numel() * static_cast<int64_t>(t.itemsize());
    host.push_back(t.defined() ? t.cpu() : t);
  }
  std::vector<Tensor> outs = run_eager(op, host, attrs);
  for (auto& o : outs) {
    if (!o.defined()) continue;
    bytes += o.int_numel() * static_cast<int64_t>(o.itemsize());
    o = o.to(dev);
  }
  if (observe::log_enabled(observe::LogCat::PerfHints))
    observe::log_line(observe::LogCat::PerfHints, "",
                      fmt::format("{} has no eager {} kernel: ran on the host with copies ({} bytes moved); compile "
                                  "the function with backend 'cuda' to keep it on the device",
                                  describe_call(op, in), dev.str(), bytes));
  return outs;
}
}  // namespace

std::vector<Tensor> run_eager(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  for (const auto& t : in)
    if (t.defined() && t.is_fake())
      throw ValueError(fmt::format("{}: a capture-time FakeTensor reached eager execution (a tensor "
                                   "escaped the function being compiled, e.g. stored in a global)",
                                   describe_call(op, in)));
  std::optional<Device> dev;
  for (const auto& t : in) {
    if (!t.defined() || t.device().type == DeviceType::CPU) continue;
    if (dev && *dev != t.device())
      throw ValueError(fmt::format("{}: expected all tensors to be on the same device, but found at least two devices, "
                                   "{} and {}",
                                   describe_call(op, in), dev->str(), t.device().str()));
    dev = t.device();
  }
  if (dev) return run_on_host_copy(op, in, attrs, *dev);
  std::vector<TensorMeta> metas = run_meta(op, in, attrs);
  KernelFn k = kernel_fn(op);
  if (!k) throw NotImplementedError(fmt::format("op '{}' has no CPU kernel", op_name(op)));
  return k(in, attrs, metas);
}

namespace {
thread_local std::span<OutputPlace>* t_output_places = nullptr;

/// The memory of the first untaken place with `dtype` and as many elements as a contiguous
/// (sizes, strides), or an undefined tensor. Only the element count must agree: a GEMM computes
/// [batch * M, N] and returns it viewed as [batch, M, N].
Tensor take_output_place(const IntVec& sizes, const IntVec& strides, DType dtype) {
  int64_t numel = 1;
  bool contiguous = strides.size() == sizes.size();
  for (size_t d = sizes.size(); contiguous && d-- > 0;) {
    contiguous = sizes[d] == 1 || strides[d] == numel;
    numel *= sizes[d];
  }
  if (!contiguous) return Tensor();
  for (OutputPlace& p : *t_output_places) {
    if (!p.data || p.dtype != dtype) continue;
    int64_t n = 1;
    for (int64_t x : p.sizes) n *= x;
    if (n != numel) continue;
    void* data = p.data;
    p.data = nullptr;
    return from_blob(data, sizes, dtype);
  }
  return Tensor();
}
}  // namespace

OutputPlacementScope::OutputPlacementScope(std::span<OutputPlace> places)
    : prev_(t_output_places), places_(places) {
  t_output_places = &places_;
}
OutputPlacementScope::~OutputPlacementScope() { t_output_places = prev_; }

Tensor empty_like_meta(const TensorMeta& m) {
  IntVec sizes = hints(m.sizes);
  IntVec strides = hints(m.strides);
  if (t_output_places)
    if (Tensor t = take_output_place(sizes, strides, m.dtype); t.defined()) return t;
  return empty_strided(sizes, strides, m.dtype);
}

Tensor make_view(const Tensor& base, const TensorMeta& m) {
  // A view's element count and span must fit as an allocation's must (expand to [2^32, 2^32] would
  // otherwise wrap numel to 0 in every kernel reading it).
  core::checked_extent(hints(m.sizes), hints(m.strides), itemsize(m.dtype), "view");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->sizes = m.sizes;
  impl->strides = m.strides;
  impl->storage_offset = m.storage_offset;
  impl->dtype = m.dtype;
  impl->device = m.device;
  return Tensor(std::move(impl));
}

// ---- dispatch ---------------------------------------------------------------------------------------
std::vector<Tensor> TraceHook::on_cond(const Tensor&, const BranchFn&, const BranchFn&, std::span<const Tensor>) {
  throw NotImplementedError("cond: the active trace hook cannot record control flow (it has no on_cond)");
}
TraceHookScope::TraceHookScope(TraceHook* hook) : scope_(hook) {}
TraceHookScope::~TraceHookScope() = default;

namespace {
std::vector<Tensor> call_untaped(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  if (TraceHook* h = current_trace_hook()) {
    if (op_info(op).flags & kDataDependentShape) return h->on_data_dependent(op, in, attrs);
    h->before_meta(op, in);
    std::vector<TensorMeta> metas = run_meta(op, in, attrs);
    return h->record(op, in, attrs, std::move(metas));
  }
  // Ops that kernels call internally are not recorded: the outer op's node stands for them.
  bool& grad_mode = t_grad_enabled;
  const bool prev = grad_mode;
  grad_mode = false;
  struct Restore {
    bool& m;
    bool v;
    ~Restore() { m = v; }
  } restore{grad_mode, prev};
  return run_eager(op, in, attrs);
}
}  // namespace

std::vector<Tensor> call(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  std::vector<Tensor> outs;
  try {
    outs = call_untaped(op, in, attrs);
  } catch (const ValueError& e) {
    // Tensor::ref()'s error (protean/tensor.h) says only what happened; name the op and the input.
    if (std::string_view(e.what()) != "operation on an undefined Tensor") throw;
    // Input 0 is never optional; later ones may be (linear's bias), so they are only listed.
    std::string which;
    if (!in.empty() && !in[0].defined()) {
      which = "input 0 is an undefined Tensor";
    } else {
      for (size_t i = 0; i < in.size(); ++i)
        if (!in[i].defined()) which += fmt::format("{}{}", which.empty() ? "" : ", ", i);
      if (which.empty()) throw;
      which = fmt::format("an input it needs is an undefined Tensor (undefined: input {})", which);
    }
    throw ValueError(fmt::format("{}: {} (a default-constructed or moved-from protean::Tensor where a tensor is "
                                 "needed)",
                                 describe_call(op, in), which));
  }
  // The autograd tape (src/autograd): recorded after the op ran (eager) or was traced (capture).
  if (tape_should_record(in))
    if (TapeRecorder rec = tape_recorder()) rec(op, in, attrs, outs);
  return outs;
}

namespace {
TapeRecorder g_tape_recorder = nullptr;
}
void set_tape_recorder(TapeRecorder recorder) { g_tape_recorder = recorder; }
TapeRecorder tape_recorder() { return g_tape_recorder; }

}  // namespace protean::ops
