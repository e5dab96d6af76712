#include "backend/cuda/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <map>
#include <mutex>

#include "backend/cuda/blas.h"
#include "backend/cuda/dnn.h"
#include "backend/cuda/graphs.h"
#include "backend/cuda/hopper_gemm.h"
#include "backend/cuda/nvrtc.h"
#include "backend/graph_stats.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "observe/phase_timer.h"
#include "observe/trace.h"
#include "ops/dispatch.h"
#include "ops/registry.h"
#include "ir/sym_util.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

namespace drv = ::protean::cuda;

namespace {

struct KernelSite {
  drv::CUfunction aligned = nullptr;
  drv::CUfunction general = nullptr;
  std::vector<uint64_t> block;  ///< the argument block: 8 bytes per parameter
  std::vector<void*> params;    ///< cuLaunchKernel's kernelParams: addresses of the block's fields
  bool programmatic = false;    ///< launched with programmatic stream serialization (see programmatic_launch)
};

/// The launch plan of one size (one set of symbol values) for plain launches: what a call at that size
/// needs beyond the buffer addresses, computed on the size's first call and kept, so a steady call
/// evaluates no size expression. Temporaries live in one arena per call (plan_arena: slots share a
/// region, other temporaries get their own), one allocation from the caching allocator instead of one
/// per buffer.
struct SizePlan {
  std::vector<int64_t> symbol_values;
  ArenaLayout arena;
  std::vector<LaunchDims> aligned, general;  ///< per kernel
  std::vector<uint8_t> sizes_allow_aligned;  ///< per kernel: VariantRule's size part holds
  std::vector<IntVec> sizes;                 ///< per buffer id: sizes of buffers outside the arena
  std::exception_ptr error;                  ///< a size the program refuses (ShapeError from launch_dims)
};
constexpr size_t kMaxSizePlans = 64;

/// A non-owning device tensor over `addr` (for host steps' copies and outputs views).
Tensor device_view(uint64_t addr, const IntVec& sizes, DType dtype, Device dev) {
  IntVec st(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(reinterpret_cast<void*>(addr), static_cast<size_t>(acc) * itemsize(dtype),
                                            dev, std::function<void(void*)>{});
  impl->sizes = to_symint_vec(sizes);
  impl->strides = to_symint_vec(st);
  impl->dtype = dtype;
  impl->device = dev;
  return Tensor(std::move(impl));
}

/// An owning contiguous device tensor of `sizes` whose storage holds `capacity` bytes when that is
/// more than its own (graph outputs: one allocation size class per bucket, GraphRunner::output_capacity).
Tensor empty_in_block(const IntVec& sizes, DType dtype, Device dev, int64_t capacity) {
  // sizes and strides straight into the tensor's vectors (a steady replay allocates per output only
  // these two, the tensor and its storage)
  SymIntVec sz(sizes.begin(), sizes.end()), st(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = SymInt(acc);
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const int64_t bytes = std::max<int64_t>(numel * static_cast<int64_t>(itemsize(dtype)), capacity);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(bytes, 1)), dev);
  impl->sizes = std::move(sz);
  impl->strides = std::move(st);
  impl->dtype = dtype;
  impl->device = dev;
  return Tensor(std::move(impl));
}

/// The device address of `t`'s first element (its storage's data plus its offset).
uint64_t device_address(const Tensor& t) {
  return reinterpret_cast<uint64_t>(t.impl()->storage->data()) + static_cast<uint64_t>(t.storage_offset().hint()) * t.itemsize();
}

class CudaArtifact final : public Artifact {
 public:
  CudaArtifact(std::shared_ptr<const CudaProgram> p, const BackendInput& in, int device)
      : p_(std::move(p)), in_(in), dev_{DeviceType::CUDA, device} {
    const CudaProgram& P = *p_;
    if (P.symbols.size() < in.symbols.size())
      throw CompileError(fmt::format("cuda: graph '{}': the program binds {} symbols but the dispatcher passes {}", P.name,
                                     P.symbols.size(), in.symbols.size()));
    for (size_t i = 0; i < in.symbols.size(); ++i)
      if (P.symbols[i] != in.symbols[i])
        throw CompileError(fmt::format("cuda: graph '{}': symbol {} of the program is {}, the dispatcher passes {}",
                                       P.name, i, sym::print(P.symbols[i]), sym::print(in.symbols[i])));
    if (P.symbols.size() > in.symbols.size())
      throw CompileError(fmt::format("cuda: graph '{}' defines size symbols at run time ({}: data-dependent sizes), "
                                     "which the cuda runtime does not bind yet; use backend cpu for this function",
                                     P.name, sym::print(P.symbols[in.symbols.size()])));
    const drv::DriverApi& api = drv::require_driver("backend cuda");
    // The load's phases (module load, entry points, constants, graphs) are spans of the compile and
    // one PROTEAN_LOGS=cache line: with the first call's (run), a warm start's time broken down.
    observe::PhaseTimer load;
    load.time("cuda context", [&] { drv::stream(device); });  // makes the device's context current
    if (!P.kernels.empty()) {
      if (P.cubin.empty()) throw CompileError(fmt::format("cuda: graph '{}' has kernels but no cubin", P.name));
      // one module per part of the translation unit (nvrtc.h: pack_cubins)
      load.time("cuda module load", [&] { modules_.load(api, P.cubin, fmt::format("cuda: graph '{}'", P.name)); });
    }
    const observe::PhaseTimer::Mark entries = observe::PhaseTimer::mark();
    auto function = [&](const std::string& entry) { return modules_.function(api, entry); };
    const bool programmatic = programmatic_launch(device);
    pdl_.id = drv::kLaunchAttrProgrammaticStreamSerialization;
    pdl_.value.programmatic_stream_serialization_allowed = 1;
    for (const CudaKernel& k : P.kernels) {
      KernelSite s;
      s.general = function(k.general.entry);
      if (k.aligned.entry == k.general.entry) s.aligned = s.general;
      else s.aligned = function(k.aligned.entry);
      for (const auto& [fn, v] : {std::pair{s.aligned, &k.aligned}, std::pair{s.general, &k.general}})
        if (v->launch.shared_bytes > 48 * 1024)
          drv::check(api.cuFuncSetAttribute(fn, drv::kFuncAttrMaxDynamicSharedBytes, static_cast<int>(v->launch.shared_bytes)),
                     fmt::format("cuFuncSetAttribute({}, max dynamic shared = {})", v->entry, v->launch.shared_bytes));
      s.block.assign(std::max<size_t>(k.arg_block_bytes / 8, k.params.size()), 0);
      for (const KernelParam& a : k.params) {
        if (a.size != 8 || a.offset % 8 != 0 || a.offset / 8 >= s.block.size())
          throw CompileError(fmt::format("cuda: kernel {}: parameter at offset {} of size {} does not fit the 8-byte "
                                         "argument block layout",
                                         k.name, a.offset, a.size));
        s.params.push_back(&s.block[a.offset / 8]);
      }
      s.programmatic = programmatic && k.waits_for_prior_grids;
      sites_.push_back(std::move(s));
    }
    load.record("cuda entry points", entries);
    int64_t uploaded = 0;
    load.time("cuda constants upload", [&] {
      for (const PlannedBuffer& b : P.buffers.buffers)
        if (b.kind == loop::BufferKind::Constant) {
          if (b.constant.device() != dev_) uploaded += b.constant.int_numel() * static_cast<int64_t>(b.constant.itemsize());
          constants_.push_back({b.id, b.constant.contiguous().to(dev_)});
          const Tensor& t = constants_.back().second;
          const bool output = std::find(P.buffers.outputs.begin(), P.buffers.outputs.end(), b.id) != P.buffers.outputs.end();
          if (!output && P.host.empty())
            constant_addresses_.push_back({b.id, device_address(t)});
          else
            constant_tensors_.push_back(constants_.size() - 1);
        }
    });
    for (const PlannedBuffer& b : P.buffers.buffers)
      if (b.kind == loop::BufferKind::Input) input_buffers_.push_back(b.id);
    // kernels that read their sizes from memory: one device copy of the call's symbol values
    if (std::any_of(P.kernels.begin(), P.kernels.end(), [](const CudaKernel& k) { return sizes_from_memory(k); }))
      sizes_ = std::make_shared<Storage>(8 * std::max<size_t>(P.symbols.size(), 1), dev_);
    if (in.mode == "reduce-overhead" || in.mode == "max-autotune") {
      std::vector<std::pair<drv::CUfunction, drv::CUfunction>> fns;
      for (const KernelSite& s : sites_) fns.emplace_back(s.aligned, s.general);
      load.time("cuda graphs set-up", [&] { graphs_ = std::make_unique<GraphRunner>(P, in_, device, std::move(fns), sizes_address()); });
    }
    load.trace_spans(in.compile_id);
    if (observe::log_enabled(observe::LogCat::Cache)) {
      std::string parts;
      for (const observe::Phase& ph : load.phases())
        parts += fmt::format("{}{} {:.2f} ms", parts.empty() ? "" : ", ", ph.name.substr(5), 1e3 * ph.wall_s);
      observe::log_line(observe::LogCat::Cache, in.compile_id,
                        fmt::format("cuda load of '{}': {} ({} module(s), {} kernels, {} bytes of constants uploaded)",
                                    P.name, parts, modules_.modules.size(), P.kernels.size(), uploaded));
    }
    for (const HostStep& h : P.host)
      if (observe::log_enabled(observe::LogCat::PerfHints))
        observe::log_line(observe::LogCat::PerfHints, in.compile_id,
                          fmt::format("cuda: {} runs on the host ({}); its inputs and outputs are copied each call",
                                      ops::op_name(h.ext.op), h.reason));
  }

  /// The plan of size `S` (built on its first call; the caller holds mu_).
  const SizePlan& size_plan(const std::vector<int64_t>& S) const {
    for (const SizePlan& sp : size_plans_)
      if (sp.symbol_values == S) return sp;
    const CudaProgram& P = *p_;
    if (size_plans_.size() >= kMaxSizePlans) size_plans_.erase(size_plans_.begin());
    SizePlan sp;
    sp.symbol_values = S;
    sp.arena = plan_arena(P, S);
    sp.sizes.resize(P.buffers.buffers.size());
    for (const PlannedBuffer& b : P.buffers.buffers)
      if (sp.arena.offset[static_cast<size_t>(b.id)] < 0 && b.kind != loop::BufferKind::Input &&
          b.kind != loop::BufferKind::Constant)
        for (const auto& e : b.sizes) sp.sizes[static_cast<size_t>(b.id)].push_back(eval_size(e, P.symbols, S));
    try {
      for (const CudaKernel& k : P.kernels) {
        const bool ok = sizes_allow_aligned_variant(k, P.symbols, S);
        sp.sizes_allow_aligned.push_back(ok);
        sp.general.push_back(launch_dims(k.general.launch, P.symbols, S));
        sp.aligned.push_back(ok ? launch_dims(k.aligned.launch, P.symbols, S) : sp.general.back());
      }
    } catch (const ShapeError&) {
      sp.error = std::current_exception();
    }
    size_plans_.push_back(std::move(sp));
    return size_plans_.back();
  }

  std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const override {
    if (!first_call_done_.exchange(true)) return first_call(inputs, symbol_values);
    return call(inputs, symbol_values);
  }

 private:
  /// The artifact's first call, timed: its span ("cuda first call") and PROTEAN_LOGS=cache line say
  /// how much of it went to cuBLASLt's set-up (handle, workspace), its heuristic queries and the
  /// algorithm table, and how much to the rest (size plan, allocations, launches).
  std::vector<Tensor> first_call(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const {
    const BlasStats b0 = blas_stats();
    const observe::PhaseTimer::Mark m = observe::PhaseTimer::mark();
    std::vector<Tensor> r = call(inputs, symbol_values);
    observe::PhaseTimer t;
    t.record("cuda first call", m);
    const BlasStats b1 = blas_stats();
    const double wall_ms = 1e3 * t.phases().back().wall_s;
    const double setup_ms = 1e3 * (b1.setup_seconds - b0.setup_seconds);
    const double heuristic_ms = 1e3 * (b1.heuristic_seconds - b0.heuristic_seconds);
    const double table_ms = 1e3 * (b1.table_read_seconds - b0.table_read_seconds);
    if (observe::trace_enabled())
      observe::trace_event("chromium_event",
                           {{"name", "cuda first call"},
                            {"ph", "X"},
                            {"ts", t.phases().back().start_us},
                            {"dur", static_cast<int64_t>(wall_ms * 1e3)},
                            {"args",
                             {{"compile_id", in_.compile_id},
                              {"cublaslt_setup_ms", setup_ms},
                              {"cublaslt_heuristic_ms", heuristic_ms},
                              {"cublaslt_heuristic_queries", b1.heuristic_queries - b0.heuristic_queries},
                              {"cublaslt_table_hits", b1.table_hits - b0.table_hits},
                              {"cublaslt_table_read_ms", table_ms},
                              {"rest_ms", wall_ms - setup_ms - heuristic_ms - table_ms}}}});
    if (observe::log_enabled(observe::LogCat::Cache))
      observe::log_line(observe::LogCat::Cache, in_.compile_id,
                        fmt::format("cuda first call of '{}': {:.2f} ms host: cuBLASLt set-up {:.2f} ms, {} heuristic "
                                    "quer{} {:.2f} ms, {} call signature(s) from the algorithm table (read in {:.2f} ms), "
                                    "the rest (size plan, allocations, launches{}) {:.2f} ms",
                                    p_->name, wall_ms, setup_ms, b1.heuristic_queries - b0.heuristic_queries,
                                    b1.heuristic_queries - b0.heuristic_queries == 1 ? "y" : "ies", heuristic_ms,
                                    b1.table_hits - b0.table_hits, table_ms, graphs_ ? ", graph recording" : "",
                                    wall_ms - setup_ms - heuristic_ms - table_ms));
    return r;
  }

  std::vector<Tensor> call(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const {
    const CudaProgram& P = *p_;
    const drv::DriverApi& api = drv::require_driver("backend cuda");
    const drv::CUstream stream = drv::stream(dev_.index);
    const size_t nb = P.buffers.buffers.size();
    std::vector<int64_t> S(symbol_values.begin(), symbol_values.end());
    if (S.size() != P.symbols.size())
      throw RuntimeError(fmt::format("cuda: graph '{}' got {} symbol values, expected {}", P.name, S.size(), P.symbols.size()));
    auto lookup = [&](sym::Expr s) -> int64_t {
      for (size_t i = 0; i < P.symbols.size(); ++i)
        if (P.symbols[i] == s) return S[i];
      throw RuntimeError(fmt::format("cuda: graph '{}': symbol {} is not bound", P.name, sym::print(s)));
    };
    for (const auto& a : in_.runtime_asserts) {
      if (!sym::evaluate(a.expr, lookup))
        throw RuntimeError(fmt::format("cuda: graph '{}': runtime assertion {} failed ({})", P.name, sym::print(a.expr),
                                       a.message));
    }
    auto sizes_of = [&](const PlannedBuffer& b) {
      IntVec sz;
      sz.reserve(b.sizes.size());
      for (const auto& e : b.sizes) sz.push_back(eval_size(e, P.symbols, S));
      return sz;
    };

    std::vector<Tensor> bufs(nb);
    std::vector<uint64_t> addr(nb, 0);
    auto set = [&](size_t id, Tensor t) {
      addr[id] = device_address(t);
      bufs[id] = std::move(t);
    };
    // what the call returns: the program's output buffers, in order
    auto outputs = [&] {
      std::vector<Tensor> result;
      result.reserve(P.buffers.outputs.size());
      for (int o : P.buffers.outputs) result.push_back(bufs[static_cast<size_t>(o)]);
      return result;
    };
    // Inputs: device tensors in place; anything else made contiguous on the device.
    for (const int input_id : input_buffers_) {
      const PlannedBuffer& b = P.buffers.buffers[static_cast<size_t>(input_id)];
      if (b.input_index < 0 || static_cast<size_t>(b.input_index) >= inputs.size())
        throw RuntimeError(fmt::format("cuda: graph '{}' reads input {} but {} were given", P.name, b.input_index,
                                       inputs.size()));
      Tensor t = inputs[static_cast<size_t>(b.input_index)];
      if (t.device() != dev_) {
        if (observe::log_enabled(observe::LogCat::PerfHints))
          observe::log_line(observe::LogCat::PerfHints, in_.compile_id,
                            fmt::format("cuda: input {} of graph '{}' is on {}: copied to {} for every call; move it "
                                        "with .to(...) once",
                                        b.input_index, P.name, t.device().str(), dev_.str()));
        t = t.to(dev_);
      } else if (!t.is_contiguous()) {
        t = t.contiguous();
      }
      set(static_cast<size_t>(b.id), std::move(t));
    }
    // constants: their addresses (fixed for the artifact's life); as tensors where the call returns
    // one or host steps read buffers as tensors
    for (const auto& [id, a] : constant_addresses_) addr[static_cast<size_t>(id)] = a;
    for (size_t i : constant_tensors_) set(static_cast<size_t>(constants_[i].first), constants_[i].second);
    auto address = [&](int id) -> uint64_t { return addr[static_cast<size_t>(id)]; };
    const SizePlan* plan = nullptr;  // plain launches: the size's launch plan
    auto run_step = [&](const Step& st) {
      switch (st.kind) {
        case StepKind::Kernel: {
          if (st.prologue_of >= 0) {  // a LayerNorm the product after it computes (hopper_gemm.h)
            const BlasStep& b = P.blas[static_cast<size_t>(st.prologue_of)];
            if (layer_norm_folded(b, blas_shape(b, P.symbols, S), address, dev_.index)) break;
          }
          const size_t ki = static_cast<size_t>(st.index);
          const CudaKernel& k = P.kernels[ki];
          KernelSite& site = sites_[ki];
          bool aligned;
          LaunchDims d;
          if (plan) {  // the size part of the variant rule and the dimensions come from the plan
            aligned = plan->sizes_allow_aligned[ki];
            for (int b : k.rule.aligned_buffers) aligned = aligned && address(b) % 16 == 0;
            d = aligned ? plan->aligned[ki] : plan->general[ki];
          } else {
            aligned = use_aligned_variant(k, P.symbols, S, address);
            d = launch_dims((aligned ? k.aligned : k.general).launch, P.symbols, S);
          }
          if (d.grid == 0) break;
          for (const KernelParam& a : k.params) site.block[a.offset / 8] = param_value(a, address, S, sizes_address());
          // the call's text is formatted only on failure (this is the per-launch hot path)
          const drv::CUfunction fn = aligned ? site.aligned : site.general;
          drv::CUresult rc;
          if (site.programmatic) {
            drv::LaunchConfig c;
            c.grid_x = d.grid;
            c.block_x = d.block;
            c.shared_bytes = d.shared_bytes;
            c.stream = stream;
            c.attrs = &pdl_;
            c.num_attrs = 1;
            rc = api.cuLaunchKernelEx(&c, fn, site.params.data(), nullptr);
          } else {
            rc = api.cuLaunchKernel(fn, d.grid, 1, 1, d.block, 1, 1, d.shared_bytes, stream, site.params.data(), nullptr);
          }
          if (rc != drv::kCudaSuccess)
            drv::check(rc, fmt::format("{}({}, grid {}, block {})", site.programmatic ? "cuLaunchKernelEx" : "cuLaunchKernel",
                                       (aligned ? k.aligned : k.general).entry, d.grid, d.block));
          break;
        }
        case StepKind::Blas: {
          const BlasStep& b = P.blas[static_cast<size_t>(st.index)];
          run_blas(b, P.symbols, S, address, dev_.index);
          break;
        }
        case StepKind::Host: {
          const HostStep& h = P.host[static_cast<size_t>(st.index)];
          run_host(h, S, bufs, addr);
          break;
        }
        case StepKind::Conv: {
          run_conv(P.conv[static_cast<size_t>(st.index)], P.symbols, S, address, dev_.index);
          break;
        }
      }
    };
    // mode "reduce-overhead": the bucket's graphs, temporaries in its arena, fresh outputs.
    if (graphs_) {
      std::unique_lock<std::mutex> glock(mu_);
      if (const uint64_t arena = graphs_->prepare(S)) {
        write_sizes(S, stream);
        const ArenaLayout& l = graphs_->layout();
        if (P.host.empty()) {
          // the bucket's arena regions and the outputs, listed on the bucket's first call (a steady
          // call walks those lists, not every buffer of the program)
          if (slots_arena_ != arena || slots_layout_ != &l) {
            arena_slots_.clear();
            output_buffers_.clear();
            for (const PlannedBuffer& b : P.buffers.buffers) {
              if (b.kind == loop::BufferKind::Input || b.kind == loop::BufferKind::Constant) continue;
              const int64_t off = l.offset[static_cast<size_t>(b.id)];
              if (off >= 0) arena_slots_.push_back({b.id, off});
              else output_buffers_.push_back(b.id);
            }
            slots_arena_ = arena;
            slots_layout_ = &l;
          }
          for (const auto& [id, off] : arena_slots_) addr[static_cast<size_t>(id)] = arena + static_cast<uint64_t>(off);
          for (const int id : output_buffers_) {
            if (bufs[static_cast<size_t>(id)].defined()) continue;  // an input returned as an output
            const PlannedBuffer& b = P.buffers.buffers[static_cast<size_t>(id)];
            set(static_cast<size_t>(id), empty_in_block(sizes_of(b), b.dtype, dev_, graphs_->output_capacity(id)));
          }
        } else {  // host steps read and write buffers as tensors
          for (const PlannedBuffer& b : P.buffers.buffers) {
            if (bufs[static_cast<size_t>(b.id)].defined() || b.kind == loop::BufferKind::Constant) continue;
            const int64_t off = l.offset[static_cast<size_t>(b.id)];
            if (off < 0)
              set(static_cast<size_t>(b.id), empty_in_block(sizes_of(b), b.dtype, dev_, graphs_->output_capacity(b.id)));
            else
              set(static_cast<size_t>(b.id), device_view(arena + static_cast<uint64_t>(off), sizes_of(b), b.dtype, dev_));
          }
        }
        // run_step by reference: a std::function holds a one-pointer closure without allocating
        graphs_->run(S, address, [&run_step](const Step& st) { run_step(st); });
        glock.unlock();
        return outputs();
      }
    }
    // Plain launches: the size's plan; the temporaries in one arena from the caching allocator (kept
    // alive to the end of the call: its release is stream-ordered after the launches), every other
    // buffer (outputs) its own allocation.
    std::unique_lock<std::mutex> lock(mu_);  // the argument blocks and plans are shared by concurrent calls
    plan = &size_plan(S);
    if (plan->error) std::rethrow_exception(plan->error);
    write_sizes(S, stream);
    std::shared_ptr<Storage> arena;
    if (plan->arena.bytes > 0) arena = std::make_shared<Storage>(static_cast<size_t>(plan->arena.bytes), dev_);
    const uint64_t base = arena ? reinterpret_cast<uint64_t>(arena->data()) : 0;
    for (const PlannedBuffer& b : P.buffers.buffers) {
      const size_t id = static_cast<size_t>(b.id);
      if (bufs[id].defined() || b.kind == loop::BufferKind::Constant) continue;  // constants: set above
      const int64_t off = plan->arena.offset[id];
      if (off < 0) set(id, empty(plan->sizes[id], b.dtype, dev_));
      else if (!P.host.empty()) set(id, device_view(base + static_cast<uint64_t>(off), sizes_of(b), b.dtype, dev_));
      else addr[id] = base + static_cast<uint64_t>(off);  // host steps read buffers as tensors; kernels need addresses
    }
    for (const Step& st : P.steps) run_step(st);
    if (graphs_) graphs_->after_plain_run(S, address);  // a new bucket: its graph is recorded in the background
    lock.unlock();
    return outputs();
  }

  void run_host(const HostStep& h, const std::vector<int64_t>& S, const std::vector<Tensor>& bufs,
                const std::vector<uint64_t>& addr) const {
    const CudaProgram& P = *p_;
    const loop::Extern& e = h.ext;
    if (!e.branches.empty())
      throw RuntimeError(fmt::format("cuda: graph '{}': control flow (cond) on the device is not supported; use backend "
                                     "cpu for this function",
                                     P.name));
    std::vector<Tensor> in;
    for (int b : e.inputs) in.push_back(b < 0 ? Tensor() : bufs[static_cast<size_t>(b)].cpu());
    ops::Attrs attrs = e.attrs;
    for (auto& item : attrs.items()) {
      auto lookup = [&](sym::Expr s) -> int64_t {
        for (size_t i = 0; i < P.symbols.size(); ++i)
          if (P.symbols[i] == s) return S[i];
        throw RuntimeError(fmt::format("cuda: host step {}: symbol {} is not bound", ops::op_name(e.op), sym::print(s)));
      };
      if (auto* si = std::get_if<SymInt>(&item.value)) {
        if (si->is_symbolic()) *si = SymInt(sym::evaluate(ir::to_expr(*si), lookup));
      } else if (auto* sv = std::get_if<SymIntVec>(&item.value)) {
        for (auto& x : *sv)
          if (x.is_symbolic()) x = SymInt(sym::evaluate(ir::to_expr(x), lookup));
      }
    }
    std::vector<Tensor> out;
    {
      ops::TraceHookScope no_hook(nullptr);
      out = ops::run_eager(e.op, in, attrs);
    }
    if (out.size() != e.outputs.size())
      throw RuntimeError(fmt::format("cuda: host step {} returned {} results, expected {}", ops::op_name(e.op), out.size(),
                                     e.outputs.size()));
    for (size_t k = 0; k < out.size(); ++k) {
      const size_t id = static_cast<size_t>(e.outputs[k]);
      Tensor c = out[k].contiguous();
      const Tensor& dst = bufs[id];
      if (c.int_numel() != dst.int_numel() || c.dtype() != dst.dtype())
        throw RuntimeError(fmt::format("cuda: host step {} produced {}{} where the plan has {}{}", ops::op_name(e.op),
                                       short_name(c.dtype()), to_string(c.sizes()), short_name(dst.dtype()),
                                       to_string(dst.sizes())));
      drv::copy_host_to_device(dev_.index, addr[id], c.int_numel() ? c.data_ptr() : nullptr,
                               static_cast<size_t>(c.int_numel()) * c.itemsize());
    }
  }

  uint64_t sizes_address() const { return sizes_ ? reinterpret_cast<uint64_t>(sizes_->data()) : 0; }
  /// Kernels that read their sizes from memory: the call's symbol values copied to sizes_ on the
  /// device's stream, ahead of the call's launches, when they differ from the last values copied
  /// (under mu_). The copy reads `S` before it returns (an asynchronous copy from pageable memory is
  /// staged at once), so S may change after it.
  void write_sizes(const std::vector<int64_t>& S, drv::CUstream stream) const {
    if (!sizes_ || S.empty() || (sizes_valid_ && sizes_written_ == S)) return;
    sizes_valid_ = false;  // stays false if the copy fails
    const drv::DriverApi& api = drv::require_driver("backend cuda");
    const auto t0 = std::chrono::steady_clock::now();
    drv::check(api.cuMemcpyHtoDAsync(reinterpret_cast<drv::CUdeviceptr>(sizes_->data()), S.data(), 8 * S.size(), stream),
               fmt::format("cuMemcpyHtoDAsync(the size values of '{}')", p_->name));
    count_size_copy(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    sizes_written_ = S;
    sizes_valid_ = true;
  }

  std::shared_ptr<const CudaProgram> p_;
  BackendInput in_;
  Device dev_;
  std::shared_ptr<Storage> sizes_;              ///< the call's symbol values on the device (sizes_from_memory kernels)
  mutable std::vector<int64_t> sizes_written_;  ///< what sizes_ holds (under mu_)
  mutable bool sizes_valid_ = false;
  CubinModules modules_;  ///< the program's cubin: a module per part of its translation unit
  mutable std::vector<KernelSite> sites_;
  drv::LaunchAttribute pdl_;  ///< the programmatic-stream-serialization attribute of programmatic sites
  std::vector<std::pair<int, Tensor>> constants_;
  std::vector<std::pair<int, uint64_t>> constant_addresses_;  ///< constants a call needs only the address of
  std::vector<size_t> constant_tensors_;  ///< constants_ a call holds as tensors (outputs; every one with host steps)
  std::vector<int> input_buffers_;        ///< the program's input buffers
  // graph modes without host steps: the current bucket's arena regions (buffer, offset) and the other
  // buffers a call allocates (outputs), for the arena at slots_arena_ laid out by *slots_layout_ (under mu_)
  mutable std::vector<std::pair<int, int64_t>> arena_slots_;
  mutable std::vector<int> output_buffers_;
  mutable uint64_t slots_arena_ = 0;
  mutable const ArenaLayout* slots_layout_ = nullptr;
  mutable std::mutex mu_;
  mutable std::vector<SizePlan> size_plans_;  ///< plain launches, per size (under mu_)
  std::unique_ptr<GraphRunner> graphs_;  ///< modes "reduce-overhead" and "max-autotune" (graphs.h)
  mutable std::atomic<bool> first_call_done_{false};
};

}  // namespace

bool programmatic_launch(int device) {
  const drv::DriverApi* api = drv::driver();
  if (!api || !api->cuLaunchKernelEx || !api->cuGraphAddDependencies) return false;
  if (const char* e = std::getenv("PROTEAN_CUDA_PDL"); e && std::string_view(e) == "0") return false;
  return drv::device_info(device).cc_major >= 9;
}

namespace {

struct CompilerSlot {
  std::mutex mu;
  CudaCompileFn fn;
};
CompilerSlot& compiler_slot() {  // a function-local static: installed from other files' static initializers
  static CompilerSlot s;
  return s;
}

}  // namespace

int device_index(const BackendInput& in) { return in.device.type == DeviceType::CUDA ? in.device.index : 0; }

std::unique_ptr<Artifact> make_cuda_artifact(std::shared_ptr<const CudaProgram> program, const BackendInput& in,
                                             int device) {
  return std::make_unique<CudaArtifact>(std::move(program), in, device);
}

void set_cuda_compiler(CudaCompileFn fn) {
  std::lock_guard<std::mutex> lock(compiler_slot().mu);
  compiler_slot().fn = std::move(fn);
}

std::unique_ptr<Artifact> compile_cuda(const BackendInput& in) {
  if (!drv::driver())
    throw CompileError(fmt::format("backend 'cuda' for graph '{}': {}; use backend 'cpu' or 'auto' on this machine",
                                   in.graph ? in.graph->name : std::string("?"), drv::driver_unavailable_reason()));
  CudaCompileFn fn;
  {
    std::lock_guard<std::mutex> lock(compiler_slot().mu);
    fn = compiler_slot().fn;
  }
  if (!fn) throw CompileError("backend 'cuda': this build has no CUDA code generator installed");
  return make_cuda_artifact(fn(in), in, device_index(in));
}

namespace {
const bool registered = [] {
  register_backend("cuda", compile_cuda);
  return true;
}();
}  // namespace

}  // namespace protean::backend::cuda
