#include "backend/cuda/program.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <thread>

#include "protean/error.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

int64_t eval_size(const sym::Expr& e, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values) {
  if (e->is_integer()) return e->value;
  // one pointer captured: the lookup's std::function keeps it without a heap allocation
  struct Bound {
    const sym::Expr& e;
    const std::vector<sym::Expr>& symbols;
    std::span<const int64_t> values;
  } bound{e, symbols, symbol_values};
  return sym::evaluate(e, [b = &bound](sym::Expr s) -> int64_t {
    for (size_t i = 0; i < b->symbols.size() && i < b->values.size(); ++i)
      if (b->symbols[i] == s) return b->values[i];
    throw ShapeError(fmt::format("cuda program: size {} uses symbol {}, which has no bound value ({} symbols bound)",
                                 sym::print(b->e), sym::print(s), b->values.size()));
  });
}

LaunchDims launch_dims(const LaunchRule& rule, const std::vector<sym::Expr>& symbols,
                       std::span<const int64_t> symbol_values) {
  const int64_t work = rule.work ? eval_size(rule.work, symbols, symbol_values) : 1;
  const int64_t len = rule.row_length && rule.row_capacity > 0 ? eval_size(rule.row_length, symbols, symbol_values) : 0;
  return launch_dims_at(rule, work, len);
}

LaunchDims launch_dims_at(const LaunchRule& rule, int64_t work, int64_t row_length) {
  LaunchDims d;
  d.block = static_cast<uint32_t>(rule.block_threads);
  d.shared_bytes = rule.shared_bytes;
  if (work < 0)
    throw ShapeError(fmt::format("cuda launch: negative work {} (= {})", work, rule.work ? sym::print(rule.work) : "1"));
  if (rule.row_length && rule.row_capacity > 0) {
    const int64_t len = row_length;
    if (len > rule.row_capacity)
      throw ShapeError(fmt::format("cuda launch: row length {} = {} exceeds the {} elements the kernel keeps in registers "
                                   "(it was compiled for that upper bound; recompile with the new range)",
                                   sym::print(rule.row_length), len, rule.row_capacity));
  }
  int64_t blocks = 0;
  switch (rule.shape) {
    case LaunchShape::GridStride: {
      const int64_t per_block = int64_t(rule.block_threads) * std::max(rule.items_per_thread, 1);
      blocks = std::min<int64_t>((work + per_block - 1) / per_block, std::max<int64_t>(rule.max_blocks, 1));
      break;
    }
    case LaunchShape::BlockPerRow: {
      const int64_t cluster = std::max(rule.cluster, 1);
      if (work > int64_t{0x7fffffff} / cluster)
        throw ShapeError(fmt::format("cuda launch: {} rows of {} blocks each exceed the grid limit 2^31 - 1", work, cluster));
      blocks = work * cluster;
      d.cluster = static_cast<uint32_t>(cluster);
      if (rule.block_from_row && rule.row_length && rule.row_capacity > 0 && rule.block_threads > 32) {
        // the fewest threads (a power of two, 32 or more) whose registers hold this row at the
        // kernel's elements per thread: a shorter row than the bound leaves room for more rows
        const int64_t per_thread = std::max<int64_t>(rule.row_capacity / (int64_t{rule.block_threads} * cluster), 1);
        const int64_t need = (row_length + per_thread * cluster - 1) / (per_thread * cluster);
        int64_t t = 32;
        while (t < need && t < rule.block_threads) t <<= 1;
        d.block = static_cast<uint32_t>(t);
      }
      break;
    }
    case LaunchShape::WarpPerRow: {
      int64_t rows = std::max(rule.rows_per_block, 1);
      if (rule.fill_blocks > 0) {
        while (rows > 1 && (work + rows - 1) / rows < rule.fill_blocks) rows /= 2;
        d.block = static_cast<uint32_t>(32 * rows);
      }
      blocks = (work + rows - 1) / rows;
      break;
    }
    case LaunchShape::Single: blocks = work > 0 ? 1 : 0; break;
  }
  if (blocks > int64_t{0x7fffffff})
    throw ShapeError(fmt::format("cuda launch: {} blocks for work {} exceed the grid limit 2^31 - 1", blocks,
                                 sym::print(rule.work)));
  d.grid = static_cast<uint32_t>(blocks);
  return d;
}

bool sizes_from_memory(const CudaKernel& k) {
  for (const KernelParam& a : k.params)
    if (a.kind == ParamKind::Sizes) return true;
  return false;
}

bool sizes_allow_aligned_variant(const CudaKernel& k, const std::vector<sym::Expr>& symbols,
                                 std::span<const int64_t> symbol_values) {
  if (k.aligned.entry == k.general.entry) return false;
  const int64_t m = std::max<int64_t>(k.rule.multiple, 1);
  for (const sym::Expr& e : k.rule.divisible)
    if (eval_size(e, symbols, symbol_values) % m != 0) return false;
  return !k.rule.size || eval_size(k.rule.size, symbols, symbol_values) >= k.rule.at_least;
}

bool use_aligned_variant(const CudaKernel& k, const std::vector<sym::Expr>& symbols,
                         std::span<const int64_t> symbol_values, const std::function<uint64_t(int)>& buffer_address) {
  if (!sizes_allow_aligned_variant(k, symbols, symbol_values)) return false;
  for (int b : k.rule.aligned_buffers)
    if (buffer_address(b) % 16 != 0) return false;
  return true;
}

const KernelVariant& select_variant(const CudaKernel& k, const std::vector<sym::Expr>& symbols,
                                    std::span<const int64_t> symbol_values,
                                    const std::function<uint64_t(int)>& buffer_address) {
  return use_aligned_variant(k, symbols, symbol_values, buffer_address) ? k.aligned : k.general;
}

uint64_t CubinKey::combined() const {
  // The layout version of the stored blob is part of the key ("v2": the container of NVRTC parts with
  // each part's entry names, nvrtc.cpp pack_cubins), so an entry written in another layout by a build
  // with the same version string is never read as this one.
  std::string s = fmt::format("cuda-cubin-v2\n{:016x}\n{}\n{}\n{}\n{}", source_hash, nvrtc_version, arch, flags, protean_version);
  return XXH64(s.data(), s.size(), 0);
}

namespace {
const char* shape_name(LaunchShape s) {
  switch (s) {
    case LaunchShape::GridStride: return "grid_stride";
    case LaunchShape::BlockPerRow: return "block_per_row";
    case LaunchShape::WarpPerRow: return "warp_per_row";
    case LaunchShape::Single: return "single_block";
  }
  return "?";
}
const char* blas_name(BlasOp o) {
  switch (o) {
    case BlasOp::Matmul: return "matmul";
    case BlasOp::Linear: return "linear";
    case BlasOp::Bmm: return "bmm";
    case BlasOp::Addmm: return "addmm";
  }
  return "?";
}
const char* gelu_name(GeluForm g) {
  switch (g) {
    case GeluForm::None: return "none";
    case GeluForm::Erf: return "erf";
    case GeluForm::Tanh: return "tanh";
  }
  return "?";
}
std::string rule_text(const LaunchRule& r) {
  std::string s = fmt::format("{} work={} threads={}", shape_name(r.shape), r.work ? sym::print(r.work) : "1", r.block_threads);
  if (r.shape == LaunchShape::GridStride) s += fmt::format(" items={} max_blocks={}", r.items_per_thread, r.max_blocks);
  if (r.shape == LaunchShape::WarpPerRow) s += fmt::format(" rows_per_block={}", r.rows_per_block);
  if (r.shape == LaunchShape::WarpPerRow && r.fill_blocks > 0) s += fmt::format(" fill_blocks={}", r.fill_blocks);
  if (r.shared_bytes) s += fmt::format(" shared={}", r.shared_bytes);
  if (r.cluster > 1) s += fmt::format(" cluster={}", r.cluster);
  if (r.row_length && r.row_capacity > 0)
    s += fmt::format(" row={} capacity={}{}", sym::print(r.row_length), r.row_capacity, r.block_from_row ? " threads_from_row" : "");
  return s;
}
}  // namespace

std::string TuneVariant::tag() const {
  return split > 1 ? fmt::format("r{}v{}s{}", rows_per_block, vector_width, split) : fmt::format("r{}v{}", rows_per_block, vector_width);
}

std::string to_text(const CudaProgram& p) {
  std::string out = fmt::format("cuda program {} ({} kernels, {} blas, {} host steps)\n", p.name, p.kernels.size(), p.blas.size(),
                                p.host.size());
  out += "symbols:";
  for (const auto& s : p.symbols) out += " " + sym::print(s);
  out += "\n";
  for (const PlannedBuffer& b : p.buffers.buffers) {
    std::string sizes;
    for (size_t i = 0; i < b.sizes.size(); ++i) sizes += (i ? ", " : "") + sym::print(b.sizes[i]);
    out += fmt::format("buffer b{} {}[{}] bytes={}", b.id, short_name(b.dtype), sizes, sym::print(b.bytes));
    if (b.input_index >= 0) out += fmt::format(" input={}", b.input_index);
    if (b.output_index >= 0) out += fmt::format(" output={}", b.output_index);
    if (b.slot >= 0) out += fmt::format(" slot={}", b.slot);
    if (b.kind == loop::BufferKind::Constant) out += " constant";
    out += "\n";
  }
  for (size_t i = 0; i < p.buffers.slots.size(); ++i)
    out += fmt::format("slot {} bytes={} align={}\n", i, sym::print(p.buffers.slots[i].bytes), p.buffers.slots[i].alignment);
  for (const Step& st : p.steps) {
    switch (st.kind) {
      case StepKind::Kernel: {
        const CudaKernel& k = p.kernels[static_cast<size_t>(st.index)];
        std::string params;
        for (const KernelParam& a : k.params)
          params += fmt::format("{}{}", params.empty() ? "" : ", ",
                                a.kind == ParamKind::Buffer   ? "b" + std::to_string(a.index)
                                : a.kind == ParamKind::Sizes ? std::string("sizes")
                                                              : sym::print(p.symbols[static_cast<size_t>(a.index)]));
        out += fmt::format("kernel {}({})\n  general {}: {}\n", k.name, params, k.general.entry, rule_text(k.general.launch));
        if (k.aligned.entry != k.general.entry) {
          std::string div;
          for (const auto& e : k.rule.divisible) div += (div.empty() ? "" : ", ") + sym::print(e);
          std::string bufs;
          for (int b : k.rule.aligned_buffers) bufs += fmt::format("{}b{}", bufs.empty() ? "" : ", ", b);
          out += fmt::format("  aligned {}: {} when", k.aligned.entry, rule_text(k.aligned.launch));
          if (!div.empty()) out += fmt::format(" [{}] % {} == 0 and", div, k.rule.multiple);
          out += fmt::format(" [{}] 16-byte aligned\n", bufs);
        }
        if (!k.tune.empty()) {
          out += "  tune";
          for (const TuneVariant& t : k.tune) out += fmt::format(" {} ({}: {})", t.tag(), t.variant.entry, rule_text(t.variant.launch));
          out += "\n";
        }
        break;
      }
      case StepKind::Blas: {
        const BlasStep& b = p.blas[static_cast<size_t>(st.index)];
        out += fmt::format("blas {} b{} = b{} x b{}{} batch={} m={} n={} k={} bias={} gelu={} residual={}\n", blas_name(b.op), b.out, b.a, b.b,
                           b.transpose_b ? "^T" : "", sym::print(b.batch), sym::print(b.m), sym::print(b.n), sym::print(b.k),
                           b.epilogue.bias, gelu_name(b.epilogue.gelu), b.epilogue.residual);
        if (b.has_prologue())
          out += fmt::format("  layer_norm prologue: step {} normalizes b{} (gamma b{}, beta b{}, eps {:g}); folded weight b{}, "
                             "vectors b{}\n",
                             b.prologue.kernel_step, b.prologue.x, b.prologue.gamma, b.prologue.beta, b.prologue.eps,
                             b.prologue.weight, b.prologue.vectors);
        break;
      }
      case StepKind::Host: {
        const HostStep& h = p.host[static_cast<size_t>(st.index)];
        out += fmt::format("host {} ({})\n", ops::op_name(h.ext.op), h.reason);
        break;
      }
      case StepKind::Conv: {
        const ConvStep& c = p.conv[static_cast<size_t>(st.index)];
        auto dims = [](const std::vector<sym::Expr>& v) {
          std::string t;
          for (const sym::Expr& e : v) t += (t.empty() ? "" : ", ") + sym::print(e);
          return "[" + t + "]";
        };
        out += fmt::format("conv {} b{} = b{}{} * b{}{} bias={} stride={}x{} padding={}x{} dilation={}x{} groups={}{} out={}\n",
                           ops::op_name(c.kind), c.out, c.x, dims(c.x_sizes), c.w, dims(c.w_sizes), c.bias, c.stride[0],
                           c.stride[1], c.padding[0], c.padding[1], c.dilation[0], c.dilation[1], c.groups,
                           c.transposed() ? fmt::format(" output_padding={}x{}", c.output_padding[0], c.output_padding[1]) : "",
                           dims(c.out_sizes));
        break;
      }
    }
  }
  return out;
}

void derive_prologue_constants(CudaProgram& p) {
  auto constant = [&](int id, const char* what, const BlasStep& s) -> PlannedBuffer& {
    if (id < 0 || static_cast<size_t>(id) >= p.buffers.buffers.size() ||
        p.buffers.buffers[static_cast<size_t>(id)].kind != loop::BufferKind::Constant)
      throw CompileError(fmt::format("cuda program '{}': the LayerNorm folded into blas b{} names {} b{}, which is not a "
                                     "constant buffer",
                                     p.name, s.out, what, id));
    return p.buffers.buffers[static_cast<size_t>(id)];
  };
  std::vector<std::function<void()>> jobs;  // the arithmetic, after every check
  for (const BlasStep& s : p.blas) {
    if (!s.has_prologue()) continue;
    const LayerNormPrologue& pr = s.prologue;
    const PlannedBuffer& wb = constant(s.b, "weight", s);
    const PlannedBuffer& gb = constant(pr.gamma, "gamma", s);
    const PlannedBuffer& bb = constant(pr.beta, "beta", s);
    PlannedBuffer& fw = constant(pr.weight, "folded weight", s);
    PlannedBuffer& vb = constant(pr.vectors, "folded vectors", s);
    if (!wb.constant.defined() || !gb.constant.defined() || !bb.constant.defined())
      throw CompileError(fmt::format("cuda program '{}': blas b{}: the LayerNorm's constants are not loaded", p.name, s.out));
    const Tensor w = wb.constant.cpu().contiguous();
    const std::vector<float> g = gb.constant.cpu().contiguous().to(DType::F32).to_vector<float>();
    const std::vector<float> be = bb.constant.cpu().contiguous().to(DType::F32).to_vector<float>();
    if (w.dtype() != DType::BF16 || w.dim() != 2)
      throw CompileError(fmt::format("cuda program '{}': blas b{}: a folded LayerNorm needs a 2-D bf16 weight", p.name, s.out));
    const IntVec ws = w.int_sizes();
    const int64_t K = s.transpose_b ? ws[1] : ws[0], N = s.transpose_b ? ws[0] : ws[1];
    if (static_cast<int64_t>(g.size()) != K || static_cast<int64_t>(be.size()) != K)
      throw CompileError(fmt::format("cuda program '{}': blas b{}: gamma and beta of {} and {} values for a depth of {}",
                                     p.name, s.out, g.size(), be.size(), K));
    jobs.push_back([&fw, &vb, w, g, be, K, N, transpose = s.transpose_b, ws] {
      const auto* src = static_cast<const BFloat16*>(w.data_ptr());
      Tensor folded = empty(ws, DType::BF16);
      auto* dst = static_cast<BFloat16*>(folded.data_ptr());
      std::vector<double> colsum(static_cast<size_t>(N), 0.0), beta_w(static_cast<size_t>(N), 0.0);
      // in the weight's memory order: rows of k for W [k, n], rows of n for W [n, k] (Linear)
      for (int64_t r = 0; r < (transpose ? N : K); ++r)
        for (int64_t c = 0; c < (transpose ? K : N); ++c) {
          const int64_t k = transpose ? c : r, n = transpose ? r : c, at = r * (transpose ? K : N) + c;
          const float wv = src[at];
          const BFloat16 f(g[static_cast<size_t>(k)] * wv);
          dst[at] = f;
          colsum[static_cast<size_t>(n)] += static_cast<float>(f);
          beta_w[static_cast<size_t>(n)] += static_cast<double>(be[static_cast<size_t>(k)]) * wv;
        }
      Tensor vec = empty({2, N}, DType::F32);
      auto* v = static_cast<float*>(vec.data_ptr());
      for (int64_t n = 0; n < N; ++n) {
        v[n] = static_cast<float>(colsum[static_cast<size_t>(n)]);
        v[N + n] = static_cast<float>(beta_w[static_cast<size_t>(n)]);
      }
      fw.constant = std::move(folded);
      vb.constant = std::move(vec);
    });
  }
  // one job per product, on up to hardware_concurrency threads (GPT-2 small: 24 products, about 50 M
  // weights)
  const size_t threads = std::max<size_t>(1, std::min<size_t>(jobs.size(), std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> failed(jobs.size());
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      try {
        jobs[i]();
      } catch (...) {  // (out of memory) rethrown on the calling thread
        failed[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace protean::backend::cuda
