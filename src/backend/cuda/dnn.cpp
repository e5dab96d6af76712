#include "backend/cuda/dnn.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "device/dynamic_library.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "protean/error.h"
#include "protean/tensor.h"

namespace protean::backend::cuda {

namespace drv = ::protean::cuda;

namespace {

using Status = int;
using Handle = void*;
using TensorDesc = void*;
using FilterDesc = void*;
using ConvDesc = void*;

// cudnnConvolutionFwdAlgoPerf_t (cudnn_cnn.h, cuDNN 9): 48 bytes, memory at 16.
struct AlgoPerf {
  int algo;
  Status status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
};
static_assert(sizeof(AlgoPerf) == 48, "cudnnConvolutionFwdAlgoPerf_t layout");

// Values from cudnn_graph.h / cudnn_ops.h / cudnn_cnn.h (cuDNN 9).
constexpr int kDataFloat = 0, kDataHalf = 2, kDataBf16 = 9;
constexpr int kNchw = 0;
constexpr int kCrossCorrelation = 1;
constexpr int kTensorOpMath = 1, kFmaMath = 3;
constexpr int kMaxAlgos = 8;

struct Dnn {
  bool ok = false;
  std::string why;
  Status (*create)(Handle*) = nullptr;
  Status (*set_stream)(Handle, drv::CUstream) = nullptr;
  const char* (*error_string)(Status) = nullptr;
  size_t (*get_version)() = nullptr;
  Status (*tensor_create)(TensorDesc*) = nullptr;
  Status (*tensor_set4d)(TensorDesc, int, int, int, int, int, int) = nullptr;
  Status (*filter_create)(FilterDesc*) = nullptr;
  Status (*filter_set4d)(FilterDesc, int, int, int, int, int, int) = nullptr;
  Status (*conv_create)(ConvDesc*) = nullptr;
  Status (*conv_set2d)(ConvDesc, int, int, int, int, int, int, int, int) = nullptr;
  Status (*conv_set_groups)(ConvDesc, int) = nullptr;
  Status (*conv_set_math)(ConvDesc, int) = nullptr;
  Status (*get_algorithm)(Handle, TensorDesc, FilterDesc, ConvDesc, TensorDesc, int, int*, AlgoPerf*) = nullptr;
  Status (*workspace_size)(Handle, TensorDesc, FilterDesc, ConvDesc, TensorDesc, int, size_t*) = nullptr;
  Status (*forward)(Handle, const void*, TensorDesc, const void*, FilterDesc, const void*, ConvDesc, int, void*, size_t,
                    const void*, TensorDesc, void*) = nullptr;
  Status (*get_bwd_algorithm)(Handle, FilterDesc, TensorDesc, ConvDesc, TensorDesc, int, int*, AlgoPerf*) = nullptr;
  Status (*bwd_workspace_size)(Handle, FilterDesc, TensorDesc, ConvDesc, TensorDesc, int, size_t*) = nullptr;
  Status (*backward_data)(Handle, const void*, FilterDesc, const void*, TensorDesc, const void*, ConvDesc, int, void*, size_t,
                          const void*, TensorDesc, void*) = nullptr;
  Status (*add_tensor)(Handle, const void*, TensorDesc, const void*, const void*, TensorDesc, void*) = nullptr;
};

const Dnn& dnn() {
  static const Dnn d = [] {
    Dnn d;
    std::vector<std::string> names;
    if (const char* e = std::getenv("PROTEAN_CUDNN"); e && *e && std::string(e) != "0") names.emplace_back(e);
    names.insert(names.end(), {"libcudnn.so.9", "/usr/local/cuda/lib/libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9"});
    std::string error, missing;
    void* lib = drv::open_first_library(names, error);
    if (!lib) {
      d.why = fmt::format("cuDNN not found (dlopen libcudnn.so.9: {})", error);
      return d;
    }
    d.ok = drv::resolve_symbol(lib, d.create, {"cudnnCreate"}, missing) &&
           drv::resolve_symbol(lib, d.set_stream, {"cudnnSetStream"}, missing) &&
           drv::resolve_symbol(lib, d.error_string, {"cudnnGetErrorString"}, missing) &&
           drv::resolve_symbol(lib, d.get_version, {"cudnnGetVersion"}, missing) &&
           drv::resolve_symbol(lib, d.tensor_create, {"cudnnCreateTensorDescriptor"}, missing) &&
           drv::resolve_symbol(lib, d.tensor_set4d, {"cudnnSetTensor4dDescriptor"}, missing) &&
           drv::resolve_symbol(lib, d.filter_create, {"cudnnCreateFilterDescriptor"}, missing) &&
           drv::resolve_symbol(lib, d.filter_set4d, {"cudnnSetFilter4dDescriptor"}, missing) &&
           drv::resolve_symbol(lib, d.conv_create, {"cudnnCreateConvolutionDescriptor"}, missing) &&
           drv::resolve_symbol(lib, d.conv_set2d, {"cudnnSetConvolution2dDescriptor"}, missing) &&
           drv::resolve_symbol(lib, d.conv_set_groups, {"cudnnSetConvolutionGroupCount"}, missing) &&
           drv::resolve_symbol(lib, d.conv_set_math, {"cudnnSetConvolutionMathType"}, missing) &&
           drv::resolve_symbol(lib, d.get_algorithm, {"cudnnGetConvolutionForwardAlgorithm_v7"}, missing) &&
           drv::resolve_symbol(lib, d.workspace_size, {"cudnnGetConvolutionForwardWorkspaceSize"}, missing) &&
           drv::resolve_symbol(lib, d.forward, {"cudnnConvolutionForward"}, missing) &&
           drv::resolve_symbol(lib, d.get_bwd_algorithm, {"cudnnGetConvolutionBackwardDataAlgorithm_v7"}, missing) &&
           drv::resolve_symbol(lib, d.bwd_workspace_size, {"cudnnGetConvolutionBackwardDataWorkspaceSize"}, missing) &&
           drv::resolve_symbol(lib, d.backward_data, {"cudnnConvolutionBackwardData"}, missing) &&
           drv::resolve_symbol(lib, d.add_tensor, {"cudnnAddTensor"}, missing);
    if (!d.ok) d.why = fmt::format("libcudnn lacks {}", missing);
    return d;
  }();
  return d;
}

void check(Status s, const char* call) {
  if (s == 0) return;
  const char* name = dnn().error_string ? dnn().error_string(s) : nullptr;
  throw RuntimeError(fmt::format("cuDNN: {} failed: {}", call, name ? name : fmt::format("cudnnStatus_t {}", s)));
}

int data_type(DType t) {
  switch (t) {
    case DType::F32: return kDataFloat;
    case DType::F16: return kDataHalf;
    case DType::BF16: return kDataBf16;
    case DType::Bool: case DType::U8: case DType::I8: case DType::I32: case DType::I64: case DType::F64: break;
  }
  throw NotImplementedError(fmt::format("cuDNN conv2d: dtype {} is not supported (f32, f16, bf16)", short_name(t)));
}

int narrow(int64_t v, const char* what) {
  if (v < 0 || v > (int64_t{1} << 31) - 1)
    throw ShapeError(fmt::format("cuDNN conv2d: {} {} does not fit the legacy API's int sizes", what, v));
  return static_cast<int>(v);
}

struct Plan {
  TensorDesc x = nullptr, y = nullptr, bias = nullptr;
  FilterDesc w = nullptr;
  ConvDesc conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
};

struct DeviceDnn {
  Handle handle = nullptr;
  std::map<ConvKey, Plan> plans;
};

std::mutex g_mu;
std::map<int, DeviceDnn> g_dev;
ConvHook g_hook;
ConvStats g_stats;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

DeviceDnn& device_dnn(int device) {
  DeviceDnn& D = g_dev[device];
  if (!D.handle) {
    const auto t0 = std::chrono::steady_clock::now();
    check(dnn().create(&D.handle), "cudnnCreate");
    check(dnn().set_stream(D.handle, drv::stream(device)), "cudnnSetStream");
    g_stats.setup_seconds += seconds_since(t0);
  }
  return D;
}

const Plan& plan_of(DeviceDnn& D, const ConvStep& st, const ConvShape& s) {
  ConvKey key;
  key.dtype = static_cast<int32_t>(st.dtype);
  key.x = s.x;
  key.w = s.w;
  key.stride = st.stride;
  key.padding = st.padding;
  key.dilation = st.dilation;
  key.groups = st.groups;
  key.output_padding = st.output_padding;
  key.transposed = st.transposed() ? 1 : 0;
  if (auto it = D.plans.find(key); it != D.plans.end()) return it->second;
  const auto t0 = std::chrono::steady_clock::now();
  const Dnn& L = dnn();
  const int dt = data_type(st.dtype);
  Plan p;
  check(L.tensor_create(&p.x), "cudnnCreateTensorDescriptor");
  check(L.tensor_set4d(p.x, kNchw, dt, narrow(s.x[0], "batch"), narrow(s.x[1], "channels"), narrow(s.x[2], "height"),
                       narrow(s.x[3], "width")),
        "cudnnSetTensor4dDescriptor(x)");
  check(L.tensor_create(&p.y), "cudnnCreateTensorDescriptor");
  check(L.tensor_set4d(p.y, kNchw, dt, narrow(s.out[0], "batch"), narrow(s.out[1], "channels"), narrow(s.out[2], "height"),
                       narrow(s.out[3], "width")),
        "cudnnSetTensor4dDescriptor(out)");
  check(L.tensor_create(&p.bias), "cudnnCreateTensorDescriptor");
  check(L.tensor_set4d(p.bias, kNchw, dt, 1, narrow(s.out[1], "channels"), 1, 1), "cudnnSetTensor4dDescriptor(bias)");
  check(L.filter_create(&p.w), "cudnnCreateFilterDescriptor");
  check(L.filter_set4d(p.w, dt, kNchw, narrow(s.w[0], "out channels"), narrow(s.w[1], "channels per group"),
                       narrow(s.w[2], "kernel height"), narrow(s.w[3], "kernel width")),
        "cudnnSetFilter4dDescriptor");
  check(L.conv_create(&p.conv), "cudnnCreateConvolutionDescriptor");
  check(L.conv_set2d(p.conv, narrow(st.padding[0], "padding"), narrow(st.padding[1], "padding"), narrow(st.stride[0], "stride"),
                     narrow(st.stride[1], "stride"), narrow(st.dilation[0], "dilation"), narrow(st.dilation[1], "dilation"),
                     kCrossCorrelation, kDataFloat),
        "cudnnSetConvolution2dDescriptor");
  check(L.conv_set_groups(p.conv, narrow(st.groups, "groups")), "cudnnSetConvolutionGroupCount");
  check(L.conv_set_math(p.conv, st.dtype == DType::F32 ? kFmaMath : kTensorOpMath), "cudnnSetConvolutionMathType");
  AlgoPerf perf[kMaxAlgos];
  int n = 0;
  // transposed: x is the backward-data call's dy and out its dx
  if (st.transposed())
    check(L.get_bwd_algorithm(D.handle, p.w, p.x, p.conv, p.y, kMaxAlgos, &n, perf),
          "cudnnGetConvolutionBackwardDataAlgorithm_v7");
  else
    check(L.get_algorithm(D.handle, p.x, p.w, p.conv, p.y, kMaxAlgos, &n, perf), "cudnnGetConvolutionForwardAlgorithm_v7");
  // The heuristic's order is a guess, not a timing: on PP-OCRv4 rec's x[1, 960, 1, 80] w[60, 960, 1, 3]
  // it ranked an FFT algorithm first, with a 7.8 GB workspace and 9 ms per call (a direct algorithm
  // takes microseconds). FFT algorithms (forward 4 and 5, backward-data 2 and 3) are skipped, and a
  // workspace above max(64 MiB, 4 x the operands' bytes) disqualifies an algorithm.
  const auto bytes = [&](const std::array<int64_t, 4>& d) {
    return static_cast<double>(d[0]) * static_cast<double>(d[1]) * static_cast<double>(d[2]) * static_cast<double>(d[3]) *
           static_cast<double>(itemsize(st.dtype));
  };
  const double ws_cap = std::max(64.0 * (1 << 20), 4.0 * (bytes(s.x) + bytes(s.w) + bytes(s.out)));
  const auto is_fft = [&](int algo) { return st.transposed() ? (algo == 2 || algo == 3) : (algo == 4 || algo == 5); };
  bool found = false;
  for (int i = 0; i < n && !found; ++i) {
    if (perf[i].status != 0 || is_fft(perf[i].algo)) continue;
    size_t ws = 0;
    const Status ws_status = st.transposed() ? L.bwd_workspace_size(D.handle, p.w, p.x, p.conv, p.y, perf[i].algo, &ws)
                                             : L.workspace_size(D.handle, p.x, p.w, p.conv, p.y, perf[i].algo, &ws);
    if (ws_status != 0 || static_cast<double>(ws) > ws_cap) continue;
    p.algo = perf[i].algo;
    p.workspace = ws;
    found = true;
  }
  if (!found)
    throw RuntimeError(fmt::format("cuDNN: no forward algorithm for conv2d x[{}, {}, {}, {}] w[{}, {}, {}, {}] groups {} ({} "
                                   "candidates, none usable); run this function with backend cpu",
                                   s.x[0], s.x[1], s.x[2], s.x[3], s.w[0], s.w[1], s.w[2], s.w[3], st.groups, n));
  ++g_stats.plans;
  const double plan_s = seconds_since(t0);
  g_stats.plan_seconds += plan_s;
  // once per call signature: which algorithm and workspace each conv shape got (a slow width shows here)
  if (observe::log_enabled(observe::LogCat::PerfHints))
    observe::log_line(observe::LogCat::PerfHints, "",
                      fmt::format("cuda: cuDNN {} x[{}, {}, {}, {}] w[{}, {}, {}, {}] groups {} {}: algorithm {} (first usable of "
                                  "{}), workspace {} bytes, planned in {:.2f} ms",
                                  ops::op_name(st.kind), s.x[0], s.x[1], s.x[2], s.x[3], s.w[0], s.w[1], s.w[2], s.w[3],
                                  st.groups, short_name(st.dtype), p.algo, n, p.workspace, plan_s * 1e3));
  g_stats.workspace_bytes = std::max<int64_t>(g_stats.workspace_bytes, static_cast<int64_t>(p.workspace));
  return D.plans.emplace(key, p).first->second;
}

}  // namespace

std::optional<ConvStep> conv_step(const loop::Program& p, const loop::Extern& e, std::string& why) {
  if (e.op != ops::OpKind::conv2d && e.op != ops::OpKind::conv_transpose2d) {
    why = "no GPU lowering";
    return std::nullopt;
  }
  if (e.inputs.size() < 2 || e.outputs.size() != 1 || e.inputs[0] < 0 || e.inputs[1] < 0) {
    why = "unexpected operands";
    return std::nullopt;
  }
  for (const loop::ExternView& v : e.views)
    if (v.offset) {
      why = "a strided view as an operand (cuDNN steps take dense buffers)";
      return std::nullopt;
    }
  auto buf = [&](int id) -> const loop::Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  const loop::Buffer& x = buf(e.inputs[0]);
  const loop::Buffer& w = buf(e.inputs[1]);
  const loop::Buffer& o = buf(e.outputs[0]);
  const int bias = e.inputs.size() > 2 ? e.inputs[2] : -1;
  if (x.sizes.size() != 4 || w.sizes.size() != 4 || o.sizes.size() != 4) {
    why = fmt::format("a {}-D input (cuDNN steps take batched NCHW conv2d)", x.sizes.size());
    return std::nullopt;
  }
  const bool dtype_ok = x.dtype == DType::F32 || x.dtype == DType::F16 || x.dtype == DType::BF16;
  if (!dtype_ok || w.dtype != x.dtype || o.dtype != x.dtype || (bias >= 0 && buf(bias).dtype != x.dtype)) {
    why = fmt::format("dtype {} (cuDNN steps take f32, f16 and bf16, the same for every operand)", short_name(x.dtype));
    return std::nullopt;
  }
  for (const char* layout : {"src_layout", "dst_layout"})
    if (e.attrs.has(layout) && e.attrs.s(layout) != "nchw") {
      why = fmt::format("{}={} (cuDNN steps take NCHW)", layout, e.attrs.s(layout));
      return std::nullopt;
    }
  ConvStep s;
  s.kind = e.op;
  s.x = e.inputs[0];
  s.w = e.inputs[1];
  s.bias = bias;
  s.out = e.outputs[0];
  s.dtype = x.dtype;
  s.x_sizes = x.sizes;
  s.w_sizes = w.sizes;
  s.out_sizes = o.sizes;
  try {
    auto param = [&](const char* name, int64_t dflt, std::array<int64_t, 2>& into) {
      IntVec v = e.attrs.has(name) ? e.attrs.ints(name) : IntVec{dflt};
      if (v.size() == 1) v.push_back(v[0]);
      if (v.size() != 2) return false;
      into = {v[0], v[1]};
      return true;
    };
    if (!param("stride", 1, s.stride) || !param("padding", 0, s.padding) || !param("dilation", 1, s.dilation) ||
        !param("output_padding", 0, s.output_padding)) {
      why = "stride, padding, dilation or output_padding with other than 1 or 2 values";
      return std::nullopt;
    }
    s.groups = e.attrs.has("groups") ? e.attrs.i("groups") : 1;
  } catch (const Error& err) {
    why = fmt::format("parameters that are not plain integers ({})", err.what());
    return std::nullopt;
  }
  if (std::string miss; !cudnn_available(&miss)) {
    why = miss;
    return std::nullopt;
  }
  return s;
}

bool ConvShape::empty() const { return x[0] == 0 || out[1] == 0 || out[2] == 0 || out[3] == 0; }

ConvShape conv_shape(const ConvStep& st, const std::vector<sym::Expr>& symbols, std::span<const int64_t> S) {
  ConvShape s;
  if (st.x_sizes.size() != 4 || st.w_sizes.size() != 4 || st.out_sizes.size() != 4)
    throw ShapeError("cuDNN conv2d: the step's x, w and out must be 4-D (NCHW)");
  for (size_t d = 0; d < 4; ++d) {
    s.x[d] = eval_size(st.x_sizes[d], symbols, S);
    s.w[d] = eval_size(st.w_sizes[d], symbols, S);
    s.out[d] = eval_size(st.out_sizes[d], symbols, S);
  }
  const bool t = st.transposed();
  const bool channels_ok = t ? s.x[1] == s.w[0] && s.w[0] % st.groups == 0 && s.out[1] == s.w[1] * st.groups
                             : s.x[1] == s.w[1] * st.groups && s.w[0] % st.groups == 0 && s.out[1] == s.w[0];
  if (st.groups < 1 || !channels_ok)
    throw ShapeError(fmt::format("cuDNN {}: x has {} channels, w [{}, {}, ...] with groups {}, out {} channels",
                                 ops::op_name(st.kind), s.x[1], s.w[0], s.w[1], st.groups, s.out[1]));
  for (size_t d = 0; d < 2; ++d) {
    const int64_t span = st.dilation[d] * (s.w[2 + d] - 1) + 1;
    const int64_t want = t ? (s.x[2 + d] - 1) * st.stride[d] - 2 * st.padding[d] + span + st.output_padding[d]
                           : (s.x[2 + d] + 2 * st.padding[d] - span) / st.stride[d] + 1;
    if (s.out[2 + d] != want || s.out[0] != s.x[0])
      throw ShapeError(fmt::format("cuDNN conv2d: output [{}, {}, {}, {}] does not follow from x [{}, {}, {}, {}] and w [{}, {}, "
                                   "{}, {}] (spatial dim {} should be {})",
                                   s.out[0], s.out[1], s.out[2], s.out[3], s.x[0], s.x[1], s.x[2], s.x[3], s.w[0], s.w[1],
                                   s.w[2], s.w[3], d, want));
  }
  return s;
}

bool cudnn_available(std::string* why) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_hook) return true;
  }
  if (const char* e = std::getenv("PROTEAN_CUDNN"); e && std::string(e) == "0") {  // read per compile (tests flip it)
    if (why) *why = "cuDNN turned off (PROTEAN_CUDNN=0)";
    return false;
  }
  const Dnn& d = dnn();
  if (!d.ok && why) *why = d.why;
  return d.ok;
}

size_t cudnn_version() { return dnn().ok ? dnn().get_version() : 0; }

void run_conv(const ConvStep& st, const std::vector<sym::Expr>& symbols, std::span<const int64_t> S,
              const std::function<uint64_t(int)>& address, int device) {
  const ConvShape shape = conv_shape(st, symbols, S);
  {
    std::unique_lock<std::mutex> lock(g_mu);
    ++g_stats.calls;
    if (g_hook) {
      ConvHook hook = g_hook;
      lock.unlock();
      hook(st, shape, address, drv::stream(device));
      return;
    }
  }
  if (shape.empty()) return;
  const Dnn& L = dnn();
  if (!L.ok) throw RuntimeError(fmt::format("cuda: conv2d needs cuDNN: {}", L.why));
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceDnn& D = device_dnn(device);
  const Plan& p = plan_of(D, st, shape);
  // the workspace from the caching allocator: freed after the call is queued, stream-ordered
  std::unique_ptr<Storage> ws;
  if (p.workspace) ws = std::make_unique<Storage>(p.workspace, Device{DeviceType::CUDA, device});
  const float one = 1.0f, zero = 0.0f;
  if (st.transposed())
    check(L.backward_data(D.handle, &one, p.w, reinterpret_cast<const void*>(address(st.w)), p.x,
                          reinterpret_cast<const void*>(address(st.x)), p.conv, p.algo, ws ? ws->data() : nullptr, p.workspace,
                          &zero, p.y, reinterpret_cast<void*>(address(st.out))),
          "cudnnConvolutionBackwardData");
  else
    check(L.forward(D.handle, &one, p.x, reinterpret_cast<const void*>(address(st.x)), p.w,
                    reinterpret_cast<const void*>(address(st.w)), p.conv, p.algo, ws ? ws->data() : nullptr, p.workspace,
                    &zero, p.y, reinterpret_cast<void*>(address(st.out))),
          "cudnnConvolutionForward");
  if (st.bias >= 0)
    check(L.add_tensor(D.handle, &one, p.bias, reinterpret_cast<const void*>(address(st.bias)), &one, p.y,
                       reinterpret_cast<void*>(address(st.out))),
          "cudnnAddTensor(bias)");
}

ConvStats conv_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

void reset_conv_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats = ConvStats{};
}

void set_conv_hook_for_testing(ConvHook hook) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hook = std::move(hook);
}

}  // namespace protean::backend::cuda
