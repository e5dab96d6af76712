#include "backend/cuda/pool_kernels.h"

#include <fmt/format.h>

#include <array>
#include <vector>

#include "backend/cuda/codegen.h"
#include "backend/cuda/pipeline.h"
#include "loop/c_expr.h"
#include "protean/error.h"

namespace protean::backend::cuda {

namespace {

using loop::Buffer;
using loop::CDialect;
using loop::c_index;

// a pair attribute (one value applies to both dims); false when absent and no default, or malformed
bool pair_attr(const ops::Attrs& a, const char* name, std::array<int64_t, 2>& v, bool has_default) {
  if (!a.has(name)) return has_default;
  IntVec x = a.ints(name);
  if (x.empty()) return has_default;
  if (x.size() == 1) x.push_back(x[0]);
  if (x.size() != 2) return false;
  v = {x[0], x[1]};
  return true;
}

}  // namespace

std::optional<CudaKernel> pool_kernel(const loop::Program& p, const loop::Extern& e, const std::string& name,
                                      std::string& source, std::string& why) {
  using ops::OpKind;
  const bool adaptive = e.op == OpKind::adaptive_avg_pool2d, avg = e.op == OpKind::avg_pool2d,
             maxp = e.op == OpKind::max_pool2d, nearest = e.op == OpKind::upsample_nearest2d;
  if (!adaptive && !avg && !maxp && !nearest) {
    why = "no GPU lowering";
    return std::nullopt;
  }
  if (e.inputs.size() != 1 || e.outputs.size() != 1 || e.inputs[0] < 0) {
    why = "unexpected operands";
    return std::nullopt;
  }
  for (const loop::ExternView& v : e.views)
    if (v.offset) {
      why = "a strided view as an operand";
      return std::nullopt;
    }
  const Buffer& x = p.buffers[static_cast<size_t>(e.inputs[0])];
  const Buffer& out = p.buffers[static_cast<size_t>(e.outputs[0])];
  if (x.dtype != DType::F32 || out.dtype != DType::F32 || x.sizes.size() != 4 || out.sizes.size() != 4) {
    why = fmt::format("{} of a {}-D {} tensor (the GPU kernel takes 4-D f32 NCHW)", ops::op_name(e.op), x.sizes.size(),
                      short_name(x.dtype));
    return std::nullopt;
  }
  std::array<int64_t, 2> k{1, 1}, s{1, 1}, pad{0, 0}, dil{1, 1};
  bool include_pad = true;
  if (avg || maxp) {
    bool ok = false;
    try {
      ok = pair_attr(e.attrs, "kernel_size", k, false);
      s = k;
      ok = ok && pair_attr(e.attrs, "stride", s, true) && pair_attr(e.attrs, "padding", pad, true) &&
           (!maxp || pair_attr(e.attrs, "dilation", dil, true));
      if (avg && e.attrs.has("count_include_pad")) include_pad = e.attrs.b("count_include_pad");
    } catch (const Error&) {
      ok = false;
    }
    if (!ok) {
      why = "window attributes that are not plain integer pairs";
      return std::nullopt;
    }
  }
  const CDialect dialect;
  const sym::Expr nc = loop::simplify_index(sym::mul(x.sizes[0], x.sizes[1]));
  const sym::Expr cells = loop::simplify_index(sym::mul(sym::mul(nc, out.sizes[2]), out.sizes[3]));
  CudaKernel kern;
  kern.name = name;
  std::vector<std::string> sig = {"const float* __restrict__ x", "float* __restrict__ out"};
  kern.params.push_back({ParamKind::Buffer, e.inputs[0], 0, 8});
  kern.params.push_back({ParamKind::Buffer, e.outputs[0], 0, 8});
  if (!add_symbol_params(p, {nc, x.sizes[2], x.sizes[3], out.sizes[2], out.sizes[3]}, kern, sig, why)) return std::nullopt;
  std::string params;
  for (size_t i = 0; i < sig.size(); ++i) params += (i ? ", " : "") + sig[i];
  const std::string sizes =
      fmt::format("  const long long NC = {}, H = {}, W = {}, OH = {}, OW = {};\n  (void)NC;\n", c_index(nc, dialect),
                  c_index(x.sizes[2], dialect), c_index(x.sizes[3], dialect), c_index(out.sizes[2], dialect),
                  c_index(out.sizes[3], dialect));
  const char* loop_head =
      "  const long long n = NC * OH * OW;\n"
      "  for (long long g = (long long)blockIdx.x * 256 + threadIdx.x; g < n; g += (long long)gridDim.x * 256) {\n"
      "    const long long ow = g % OW, oh = (g / OW) % OH, pc = g / (OW * OH);\n"
      "    const float* __restrict__ plane = x + pc * H * W;\n";
  std::string body;
  if (adaptive) {
    body =
        "  const long long g = blockIdx.x;\n"
        "  const long long ow = g % OW, oh = (g / OW) % OH, pc = g / (OW * OH);\n"
        "  const float* __restrict__ plane = x + pc * H * W;\n"
        "  const long long h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;\n"
        "  const long long w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;\n"
        "  const long long ww = w1 - w0, count = (h1 - h0) * ww;\n"
        "  float acc = 0.0f;\n"
        "  for (long long t = threadIdx.x; t < count; t += 256) acc += plane[(h0 + t / ww) * W + w0 + t % ww];\n"
        "#pragma unroll\n"
        "  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);\n"
        "  __shared__ float warp_sum[8];\n"
        "  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;\n"
        "  __syncthreads();\n"
        "  if (threadIdx.x == 0) {\n"
        "    float total = 0.0f;\n"
        "    for (int w = 0; w < 8; ++w) total += warp_sum[w];\n"
        "    out[g] = count > 0 ? total / (float)count : 0.0f;\n"
        "  }\n";
  } else if (nearest) {
    body = std::string(loop_head) +
           "    long long sh = oh * H / OH, sw = ow * W / OW;\n"
           "    if (sh > H - 1) sh = H - 1;\n"
           "    if (sw > W - 1) sw = W - 1;\n"
           "    out[g] = plane[sh * W + sw];\n"
           "  }\n";
  } else if (avg) {
    body = std::string(loop_head) +
           fmt::format(
               "    long long hs = oh * {0} - {2}, ws = ow * {1} - {3};\n"
               "    long long he = hs + {4} < H + {2} ? hs + {4} : H + {2}, we = ws + {5} < W + {3} ? ws + {5} : W + {3};\n"
               "    const long long pool = (he - hs) * (we - ws);\n"
               "    if (hs < 0) hs = 0;\n"
               "    if (ws < 0) ws = 0;\n"
               "    if (he > H) he = H;\n"
               "    if (we > W) we = W;\n"
               "    float acc = 0.0f;\n"
               "    for (long long h = hs; h < he; ++h)\n"
               "      for (long long w = ws; w < we; ++w) acc += plane[h * W + w];\n"
               "    const long long div = {6} ? pool : (he - hs) * (we - ws);\n"
               "    out[g] = div > 0 ? acc / (float)div : 0.0f;\n"
               "  }}\n",
               s[0], s[1], pad[0], pad[1], k[0], k[1], include_pad ? 1 : 0);
  } else {
    body = std::string(loop_head) +
           fmt::format(
               "    float best = -__int_as_float(0x7f800000);\n"
               "    bool nan = false;\n"
               "    for (long long i = 0; i < {4}; ++i) {{\n"
               "      const long long h = oh * {0} - {2} + i * {6};\n"
               "      if (h < 0 || h >= H) continue;\n"
               "      for (long long j = 0; j < {5}; ++j) {{\n"
               "        const long long w = ow * {1} - {3} + j * {7};\n"
               "        if (w < 0 || w >= W) continue;\n"
               "        const float v = plane[h * W + w];\n"
               "        if (v != v) nan = true;\n"
               "        else if (v > best) best = v;\n"
               "      }}\n"
               "    }}\n"
               "    out[g] = nan ? __int_as_float(0x7fc00000) : best;\n"
               "  }}\n",
               s[0], s[1], pad[0], pad[1], k[0], k[1], dil[0], dil[1]);
  }
  source += fmt::format("\n// {} (extern {})\nextern \"C\" __global__ void __launch_bounds__(256) {}({}) {{\n{}{}{}}}\n", name,
                        ops::op_name(e.op), name, params, kWaitPriorGrids, sizes, body);
  kern.general.entry = name;
  kern.general.launch.shape = adaptive ? LaunchShape::BlockPerRow : LaunchShape::GridStride;
  kern.general.launch.work = cells;
  kern.general.launch.block_threads = 256;
  kern.aligned = kern.general;
  return kern;
}

}  // namespace protean::backend::cuda
