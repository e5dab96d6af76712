#include "backend/cuda/plan_cache.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cache/build_id.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/dnn.h"
#include "backend/plan_codec.h"
#include "ir/graph.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "ops/registry.h"
#include "protean/error.h"
#include "protean/version.h"
#include "sym/printer.h"

extern char** environ;

namespace protean::backend::cuda {

namespace {

constexpr char kMagic[8] = {'P', 'C', 'U', 'D', 'A', 'P', 'L', '3'};
constexpr uint32_t kMaxCount = 1u << 24;  // any count above this is corrupt

/// The graph's Constant nodes (top level), in node order: what a plan's constant references index.
using backend::graph_constants;

bool has_subgraphs(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (!n.subgraphs.empty()) return true;
  return false;
}

// ---- the plan codec with symbolic sizes -------------------------------------------------------------

struct Writer : backend::PlanWriter {
  void expr(const sym::Expr& e) {
    put<uint8_t>(e ? 1 : 0);
    if (e) str(sym::print(e));
  }
  void exprs(const std::vector<sym::Expr>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const sym::Expr& e : v) expr(e);
  }
  void ints(const std::vector<int>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (int x : v) put<int32_t>(x);
  }
};

struct Reader : backend::PlanReader {
  using PlanReader::count;
  uint32_t count(const char* what) {
    const uint32_t n = get<uint32_t>(what);
    if (n > kMaxCount) fail(fmt::format("{} count {} is out of range", what, n));
    return n;
  }
  sym::Expr expr(const char* what) {
    const uint8_t present = get<uint8_t>(what);
    if (present > 1) fail(fmt::format("bad presence flag {} of {}", present, what));
    if (!present) return sym::Expr{};
    const std::string text = str(what);
    try {
      return sym::parse(text);
    } catch (const std::exception& e) {
      fail(fmt::format("{} '{}' does not parse: {}", what, text, e.what()));
    }
  }
  std::vector<sym::Expr> exprs(const char* what) {
    std::vector<sym::Expr> v(count(what));
    for (sym::Expr& e : v) e = expr(what);
    return v;
  }
  std::vector<int> ints(const char* what) {
    std::vector<int> v(count(what));
    for (int& x : v) x = get<int32_t>(what);
    return v;
  }
  /// An enum stored as its value, checked against the number of its enumerators.
  template <class E>
  E small_enum(const char* what, uint8_t enumerators) {
    const uint8_t v = get<uint8_t>(what);
    if (v >= enumerators) fail(fmt::format("{} {} is not one of its {} values", what, v, enumerators));
    return static_cast<E>(v);
  }
  DType dtype(const char* what) {
    const std::string s = str(what);
    try {
      return parse_dtype(s);
    } catch (const std::exception&) {
      fail(fmt::format("{} '{}' is not a dtype", what, s));
    }
  }
};

// Enumerator counts of the program's small enums (program.h, loop_ir.h), for the reader's checks.
constexpr uint8_t kLaunchShapes = 4, kParamKinds = 3, kBufferKinds = 4, kBlasOps = 4, kGeluForms = 3, kStepKinds = 4;

void put_variant(Writer& w, const KernelVariant& v) {
  w.str(v.entry);
  const LaunchRule& r = v.launch;
  w.put<uint8_t>(static_cast<uint8_t>(r.shape));
  w.expr(r.work);
  w.put<int32_t>(r.block_threads);
  w.put<int32_t>(r.items_per_thread);
  w.put<int32_t>(r.rows_per_block);
  w.put<int64_t>(r.max_blocks);
  w.put<uint32_t>(r.shared_bytes);
  w.expr(r.row_length);
  w.put<int64_t>(r.row_capacity);
  w.put<uint8_t>(r.block_from_row ? 1 : 0);
  w.put<int32_t>(r.cluster);
  w.put<int64_t>(r.fill_blocks);
  const PtxasInfo& x = v.resources;
  w.put<uint8_t>(x.present ? 1 : 0);
  for (int f : {x.registers, x.spill_stores, x.spill_loads, x.stack_bytes, x.shared_bytes, x.constant_bytes}) w.put<int32_t>(f);
}

KernelVariant get_variant(Reader& r) {
  KernelVariant v;
  v.entry = r.str("entry point");
  LaunchRule& l = v.launch;
  l.shape = r.small_enum<LaunchShape>("launch shape", kLaunchShapes);
  l.work = r.expr("launch work");
  l.block_threads = r.get<int32_t>("block threads");
  l.items_per_thread = r.get<int32_t>("items per thread");
  l.rows_per_block = r.get<int32_t>("rows per block");
  l.max_blocks = r.get<int64_t>("max blocks");
  l.shared_bytes = r.get<uint32_t>("shared bytes");
  l.row_length = r.expr("row length");
  l.row_capacity = r.get<int64_t>("row capacity");
  l.block_from_row = r.get<uint8_t>("block from row") != 0;
  l.cluster = r.get<int32_t>("cluster");
  l.fill_blocks = r.get<int64_t>("fill blocks");
  if (l.block_threads < 1 || l.block_threads > 1024 || l.items_per_thread < 1 || l.rows_per_block < 1 || l.max_blocks < 1 ||
      l.cluster < 1 || l.cluster > 8 || l.fill_blocks < 0 || l.fill_blocks > int64_t{0x7fffffff})
    r.fail(fmt::format("launch rule of {} out of range (block {}, items {}, rows {}, max blocks {}, cluster {}, fill blocks {})",
                       v.entry, l.block_threads, l.items_per_thread, l.rows_per_block, l.max_blocks, l.cluster, l.fill_blocks));
  PtxasInfo& x = v.resources;
  x.present = r.get<uint8_t>("ptxas flag") != 0;
  for (int* f : {&x.registers, &x.spill_stores, &x.spill_loads, &x.stack_bytes, &x.shared_bytes, &x.constant_bytes})
    *f = r.get<int32_t>("ptxas report");
  return v;
}

/// The index among `gc` of the Constant node whose tensor `c` is (the same tensor, or the same bytes
/// of the same storage), else -1.
int64_t constant_ref(const Tensor& c, const std::vector<const Tensor*>& gc) {
  for (size_t i = 0; i < gc.size(); ++i)
    if (gc[i]->defined() && gc[i]->impl() == c.impl()) return static_cast<int64_t>(i);
  for (size_t i = 0; i < gc.size(); ++i) {
    const Tensor& t = *gc[i];
    if (!t.defined() || t.is_fake() || t.dtype() != c.dtype() || t.device() != c.device() || !t.is_contiguous() ||
        !c.is_contiguous() || t.int_numel() != c.int_numel())
      continue;
    if (t.impl()->storage && c.impl()->storage && t.impl()->storage->data() == c.impl()->storage->data() &&
        t.storage_offset().hint() == c.storage_offset().hint())
      return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

CudaPlanKey cuda_plan_key(const BackendInput& in, const std::string& arch) {
  CudaPlanKey k;
  if (!in.graph || has_subgraphs(*in.graph)) return k;
  std::string& t = k.text;
  t = fmt::format("protean cuda plan 3\nversion {} build {}\narch {}\nmode {}\nswitches", version(), cache::code_build_id(), arch,
                  in.mode);
  std::vector<std::string> vars;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "PROTEAN_CUDA_", 13) == 0 || std::strncmp(*e, "PROTEAN_LOOP_", 13) == 0) vars.emplace_back(*e);
  std::sort(vars.begin(), vars.end());
  for (const std::string& v : vars) t += " " + v;
  // whether convolutions lower to cuDNN steps or stay host steps depends on the library being there
  const bool dnn = cudnn_available();
  t += fmt::format("\ncudnn {}", dnn ? std::to_string(cudnn_version()) : std::string("off"));
  t += "\nsymbols";
  for (const sym::Expr& s : in.symbols) t += " " + (s ? sym::print(s) : std::string("?"));
  t += "\nasserts\n";
  for (const sym::RuntimeAssert& a : in.runtime_asserts) t += sym::print(a.expr) + " : " + a.message + "\n";
  t += "upper bounds";
  for (const auto& [name, v] : in.upper_bounds) t += fmt::format(" {}={}", name, v);
  t += "\n" + ir::print(*in.graph) + "\nconstants\n";
  for (const Tensor* c : graph_constants(*in.graph)) {
    if (!c->defined() || c->is_fake()) return CudaPlanKey{};
    t += fmt::format("{} {} {} {}", short_name(c->dtype()), ir::symints_text(c->sizes()), ir::symints_text(c->strides()),
                     c->device().str());
    if (c->int_numel() <= kPlanHashedConstantElements) {
      const Tensor dense = c->contiguous().cpu();
      const size_t n = static_cast<size_t>(dense.int_numel()) * dense.itemsize();
      t += fmt::format(" {:016x}", n ? XXH3_64bits(dense.data_ptr(), n) : uint64_t{0});
    }
    t += "\n";
  }
  k.key = XXH3_64bits(t.data(), t.size());
  k.cacheable = true;
  return k;
}

std::optional<std::string> encode_cuda_plan(const CudaProgram& p, const ir::Graph& g) {
  if (!p.host.empty()) return std::nullopt;  // host steps are not stored
  Writer w;
  w.out.append(kMagic, sizeof(kMagic));
  w.str(p.name);
  w.str(p.source);
  w.str(p.tune_source);
  w.put<uint64_t>(p.key.source_hash);
  w.str(p.key.nvrtc_version);
  w.str(p.key.arch);
  w.str(p.key.flags);
  w.str(p.key.protean_version);
  w.exprs(p.symbols);
  // buffers
  const std::vector<const Tensor*> gc = graph_constants(g);
  w.put<uint32_t>(static_cast<uint32_t>(p.buffers.buffers.size()));
  for (const PlannedBuffer& b : p.buffers.buffers) {
    w.put<int32_t>(b.id);
    w.str(std::string(short_name(b.dtype)));
    w.exprs(b.sizes);
    w.expr(b.bytes);
    w.put<uint8_t>(static_cast<uint8_t>(b.kind));
    w.put<int32_t>(b.input_index);
    w.put<int32_t>(b.output_index);
    w.put<int32_t>(b.slot);
    w.put<uint8_t>(b.from_extern ? 1 : 0);
    if (b.kind != loop::BufferKind::Constant) continue;
    if (b.derived) {  // made again from the plan's LayerNormPrologue at load (derive_prologue_constants)
      w.put<int64_t>(-2);
      continue;
    }
    if (!b.constant.defined()) return std::nullopt;
    const int64_t ref = constant_ref(b.constant, gc);
    w.put<int64_t>(ref);
    if (ref >= 0) continue;
    // a constant lowering made: its bytes, when small
    const Tensor dense = b.constant.contiguous().cpu();
    const int64_t n = dense.int_numel() * static_cast<int64_t>(dense.itemsize());
    if (n > kPlanInlineConstantBytes) return std::nullopt;
    w.str(std::string(short_name(dense.dtype())));
    w.put<uint32_t>(static_cast<uint32_t>(dense.dim()));
    for (int64_t d : dense.int_sizes()) w.put<int64_t>(d);
    w.str(std::string(n ? static_cast<const char*>(dense.data_ptr()) : "", static_cast<size_t>(n)));
  }
  w.put<uint32_t>(static_cast<uint32_t>(p.buffers.slots.size()));
  for (const Slot& s : p.buffers.slots) {
    w.expr(s.bytes);
    w.put<int64_t>(s.alignment);
    w.ints(s.members);
  }
  w.ints(p.buffers.outputs);
  // kernels
  w.put<uint32_t>(static_cast<uint32_t>(p.kernels.size()));
  for (const CudaKernel& k : p.kernels) {
    w.str(k.name);
    put_variant(w, k.aligned);
    put_variant(w, k.general);
    w.exprs(k.rule.divisible);
    w.put<int64_t>(k.rule.multiple);
    w.ints(k.rule.aligned_buffers);
    w.exprs(k.rule.size ? std::vector<sym::Expr>{k.rule.size} : std::vector<sym::Expr>{});
    w.put<int64_t>(k.rule.at_least);
    w.put<uint32_t>(static_cast<uint32_t>(k.params.size()));
    for (const KernelParam& a : k.params) {
      w.put<uint8_t>(static_cast<uint8_t>(a.kind));
      w.put<int32_t>(a.index);
      w.put<uint32_t>(a.offset);
      w.put<uint32_t>(a.size);
    }
    w.put<uint32_t>(k.arg_block_bytes);
    w.put<uint32_t>(static_cast<uint32_t>(k.tune.size()));
    for (const TuneVariant& t : k.tune) {
      w.put<int32_t>(t.rows_per_block);
      w.put<int32_t>(t.vector_width);
      w.put<int32_t>(t.split);
      put_variant(w, t.variant);
      w.exprs(t.rule.divisible);
      w.put<int64_t>(t.rule.multiple);
      w.ints(t.rule.aligned_buffers);
    }
  }
  // BLAS steps
  w.put<uint32_t>(static_cast<uint32_t>(p.blas.size()));
  for (const BlasStep& s : p.blas) {
    w.put<uint8_t>(static_cast<uint8_t>(s.op));
    w.str(std::string(ops::op_name(s.kind)));
    for (int x : {s.a, s.b, s.out}) w.put<int32_t>(x);
    w.str(std::string(short_name(s.dtype)));
    w.put<uint8_t>(s.transpose_b ? 1 : 0);
    for (const sym::Expr* e : {&s.batch, &s.m, &s.n, &s.k, &s.batch_stride_a, &s.batch_stride_b}) w.expr(*e);
    w.put<int32_t>(s.epilogue.bias);
    w.put<uint8_t>(static_cast<uint8_t>(s.epilogue.gelu));
    w.put<int32_t>(s.epilogue.residual);
    w.put<double>(s.epilogue.alpha);
    w.put<double>(s.epilogue.beta);
    const LayerNormPrologue& pr = s.prologue;
    for (int x : {pr.kernel_step, pr.x, pr.gamma, pr.beta, pr.weight, pr.vectors}) w.put<int32_t>(x);
    w.put<double>(pr.eps);
  }
  // cuDNN convolution steps (dnn.h)
  w.put<uint32_t>(static_cast<uint32_t>(p.conv.size()));
  for (const ConvStep& s : p.conv) {
    w.str(std::string(ops::op_name(s.kind)));
    for (int x : {s.x, s.w, s.bias, s.out}) w.put<int32_t>(x);
    w.str(std::string(short_name(s.dtype)));
    for (const auto* v : {&s.x_sizes, &s.w_sizes, &s.out_sizes}) w.exprs(*v);
    for (const auto* a : {&s.stride, &s.padding, &s.dilation, &s.output_padding})
      for (int64_t x : *a) w.put<int64_t>(x);
    w.put<int64_t>(s.groups);
  }
  // steps
  w.put<uint32_t>(static_cast<uint32_t>(p.steps.size()));
  for (const Step& s : p.steps) {
    w.put<uint8_t>(static_cast<uint8_t>(s.kind));
    w.put<int32_t>(s.index);
    w.ints(s.release);
    w.put<int32_t>(s.prologue_of);
  }
  w.put<uint64_t>(XXH64(w.out.data(), w.out.size(), 0));
  return std::move(w.out);
}

CudaProgram decode_cuda_plan(const std::string& bytes, const BackendInput& in) {
  if (bytes.size() < sizeof(kMagic) + sizeof(uint64_t) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw FormatError("cuda plan: not a plan (magic PCUDAPL3 missing)");
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - sizeof(sum), sizeof(sum));
  if (sum != XXH64(bytes.data(), bytes.size() - sizeof(sum), 0)) throw FormatError("cuda plan: checksum mismatch");
  const std::string body = bytes.substr(0, bytes.size() - sizeof(sum));
  Reader r{{body, sizeof(kMagic), "cuda plan"}};
  CudaProgram p;
  p.name = r.str("name");
  p.source = r.str("source");
  p.tune_source = r.str("tune source");
  p.key.source_hash = r.get<uint64_t>("source hash");
  p.key.nvrtc_version = r.str("nvrtc version");
  p.key.arch = r.str("arch");
  p.key.flags = r.str("flags");
  p.key.protean_version = r.str("protean version");
  p.symbols = r.exprs("symbol");
  if (p.symbols.size() != in.symbols.size()) r.fail(fmt::format("{} symbols where the graph passes {}", p.symbols.size(), in.symbols.size()));
  for (size_t i = 0; i < p.symbols.size(); ++i)
    if (!p.symbols[i] || !in.symbols[i] || p.symbols[i] != in.symbols[i])
      r.fail(fmt::format("symbol {} is {} where the graph passes {}", i, p.symbols[i] ? sym::print(p.symbols[i]) : "?",
                         in.symbols[i] ? sym::print(in.symbols[i]) : "?"));
  const std::vector<const Tensor*> gc = graph_constants(*in.graph);
  const uint32_t nb = r.count("buffer");
  p.buffers.buffers.resize(nb);
  for (uint32_t i = 0; i < nb; ++i) {
    PlannedBuffer& b = p.buffers.buffers[i];
    b.id = r.get<int32_t>("buffer id");
    if (b.id != static_cast<int>(i)) r.fail(fmt::format("buffer {} has id {}", i, b.id));
    b.dtype = r.dtype("buffer dtype");
    b.sizes = r.exprs("buffer size");
    b.bytes = r.expr("buffer bytes");
    b.kind = r.small_enum<loop::BufferKind>("buffer kind", kBufferKinds);
    b.input_index = r.get<int32_t>("input index");
    b.output_index = r.get<int32_t>("output index");
    b.slot = r.get<int32_t>("slot");
    b.from_extern = r.get<uint8_t>("from extern") != 0;
    if (b.kind != loop::BufferKind::Constant) continue;
    const int64_t ref = r.get<int64_t>("constant reference");
    if (ref == -2) {
      b.derived = true;
      continue;
    }
    if (ref >= 0) {
      if (static_cast<size_t>(ref) >= gc.size())
        r.fail(fmt::format("buffer {} refers to constant {} of a graph with {}", i, ref, gc.size()));
      const Tensor& c = *gc[static_cast<size_t>(ref)];
      if (!c.defined() || c.is_fake() || c.dtype() != b.dtype)
        r.fail(fmt::format("buffer {}: constant {} of the graph is not a {} tensor", i, ref, short_name(b.dtype)));
      b.constant = c;
      continue;
    }
    if (ref != -1) r.fail(fmt::format("buffer {}: constant reference {}", i, ref));
    const DType t = r.dtype("constant dtype");
    const uint32_t rank = r.count("constant rank");
    IntVec sizes(rank);
    int64_t numel = 1;
    for (int64_t& d : sizes) {
      d = r.get<int64_t>("constant size");
      if (d < 0 || d > kPlanInlineConstantBytes) r.fail(fmt::format("buffer {}: constant size {}", i, d));
      numel *= d;
      if (numel > kPlanInlineConstantBytes) r.fail(fmt::format("buffer {}: constant of more than {} elements", i, numel));
    }
    const std::string data = r.str("constant bytes");
    if (static_cast<int64_t>(data.size()) != numel * static_cast<int64_t>(itemsize(t)) || t != b.dtype)
      r.fail(fmt::format("buffer {}: {} bytes of constant for {} {} elements", i, data.size(), numel, short_name(t)));
    b.constant = empty(sizes, t);
    if (!data.empty()) std::memcpy(b.constant.data_ptr(), data.data(), data.size());
  }
  auto buffer_ok = [&](int id) { return id >= 0 && static_cast<uint32_t>(id) < nb; };
  const uint32_t ns = r.count("slot");
  p.buffers.slots.resize(ns);
  for (Slot& s : p.buffers.slots) {
    s.bytes = r.expr("slot bytes");
    s.alignment = r.get<int64_t>("slot alignment");
    s.members = r.ints("slot member");
    if (s.alignment < 1) r.fail(fmt::format("slot alignment {}", s.alignment));
    for (int m : s.members)
      if (!buffer_ok(m)) r.fail(fmt::format("slot member {} is not a buffer", m));
  }
  for (const PlannedBuffer& b : p.buffers.buffers)
    if (b.slot >= 0 && static_cast<uint32_t>(b.slot) >= ns) r.fail(fmt::format("buffer {} in slot {} of {}", b.id, b.slot, ns));
  p.buffers.outputs = r.ints("output");
  for (int o : p.buffers.outputs)
    if (!buffer_ok(o)) r.fail(fmt::format("output buffer {} is not a buffer", o));
  const uint32_t nk = r.count("kernel");
  p.kernels.resize(nk);
  for (CudaKernel& k : p.kernels) {
    k.name = r.str("kernel name");
    k.aligned = get_variant(r);
    k.general = get_variant(r);
    k.rule.divisible = r.exprs("divisible size");
    k.rule.multiple = r.get<int64_t>("multiple");
    k.rule.aligned_buffers = r.ints("aligned buffer");
    const std::vector<sym::Expr> at_least_size = r.exprs("variant size");
    if (at_least_size.size() > 1) r.fail(fmt::format("kernel {}: {} variant sizes", k.name, at_least_size.size()));
    if (!at_least_size.empty()) k.rule.size = at_least_size[0];
    k.rule.at_least = r.get<int64_t>("variant size bound");
    for (int b : k.rule.aligned_buffers)
      if (!buffer_ok(b)) r.fail(fmt::format("kernel {}: aligned buffer {} is not a buffer", k.name, b));
    const uint32_t np = r.count("parameter");
    k.params.resize(np);
    for (KernelParam& a : k.params) {
      a.kind = r.small_enum<ParamKind>("parameter kind", kParamKinds);
      a.index = r.get<int32_t>("parameter index");
      a.offset = r.get<uint32_t>("parameter offset");
      a.size = r.get<uint32_t>("parameter size");
      const bool ok = a.kind == ParamKind::Buffer  ? buffer_ok(a.index)
                      : a.kind == ParamKind::Sizes ? a.index == -1
                                                   : a.index >= 0 && static_cast<size_t>(a.index) < p.symbols.size();
      if (!ok) r.fail(fmt::format("kernel {}: parameter index {} out of range", k.name, a.index));
    }
    k.arg_block_bytes = r.get<uint32_t>("argument block bytes");
    if (k.arg_block_bytes > 8u * (np + 64)) r.fail(fmt::format("kernel {}: argument block of {} bytes", k.name, k.arg_block_bytes));
    k.tune.resize(r.count("tune variant"));
    for (TuneVariant& t : k.tune) {
      t.rows_per_block = r.get<int32_t>("rows per block");
      t.vector_width = r.get<int32_t>("vector width");
      t.split = r.get<int32_t>("split");
      t.variant = get_variant(r);
      t.rule.divisible = r.exprs("divisible size");
      t.rule.multiple = r.get<int64_t>("multiple");
      t.rule.aligned_buffers = r.ints("aligned buffer");
      if (t.rows_per_block < 1 || t.rows_per_block > 32 || t.vector_width < 1 || t.vector_width > 16 || t.rule.multiple < 1 ||
          t.split < 1 || t.split != t.variant.launch.cluster)
        r.fail(fmt::format("kernel {}: tune variant {} out of range", k.name, t.variant.entry));
      if (p.tune_source.find(t.variant.entry + "(") == std::string::npos)
        r.fail(fmt::format("kernel {}: tune variant {} is not in the tune source", k.name, t.variant.entry));
      for (int b : t.rule.aligned_buffers)
        if (!buffer_ok(b)) r.fail(fmt::format("kernel {}: aligned buffer {} is not a buffer", k.name, b));
    }
  }
  // what the compile derives from the source text, derived again (never trusted from the file)
  const std::set<std::string> waiting = entries_waiting_for_prior_grids(p.source);
  for (CudaKernel& k : p.kernels)
    k.waits_for_prior_grids = waiting.count(k.general.entry) && waiting.count(k.aligned.entry);
  const uint32_t nblas = r.count("blas step");
  p.blas.resize(nblas);
  for (BlasStep& s : p.blas) {
    s.op = r.small_enum<BlasOp>("blas op", kBlasOps);
    const std::string kind = r.str("blas op kind");
    const std::optional<ops::OpKind> ok = ops::op_from_name(kind);
    if (!ok) r.fail(fmt::format("blas op kind '{}' is not an op", kind));
    s.kind = *ok;
    for (int* x : {&s.a, &s.b, &s.out}) {
      *x = r.get<int32_t>("blas operand");
      if (!buffer_ok(*x)) r.fail(fmt::format("blas operand {} is not a buffer", *x));
    }
    s.dtype = r.dtype("blas dtype");
    s.transpose_b = r.get<uint8_t>("transpose") != 0;
    for (sym::Expr* e : {&s.batch, &s.m, &s.n, &s.k, &s.batch_stride_a, &s.batch_stride_b}) *e = r.expr("blas size");
    if (!s.m || !s.n || !s.k) r.fail("a blas step without m, n or k");
    s.epilogue.bias = r.get<int32_t>("bias");
    s.epilogue.gelu = r.small_enum<GeluForm>("gelu form", kGeluForms);
    s.epilogue.residual = r.get<int32_t>("residual");
    s.epilogue.alpha = r.get<double>("alpha");
    s.epilogue.beta = r.get<double>("beta");
    for (int x : {s.epilogue.bias, s.epilogue.residual})
      if (x != -1 && !buffer_ok(x)) r.fail(fmt::format("blas epilogue buffer {} is not a buffer", x));
    LayerNormPrologue& pr = s.prologue;
    for (int* x : {&pr.kernel_step, &pr.x, &pr.gamma, &pr.beta, &pr.weight, &pr.vectors}) *x = r.get<int32_t>("prologue field");
    pr.eps = r.get<double>("prologue eps");
    if (pr.kernel_step != -1) {
      for (int x : {pr.x, pr.gamma, pr.beta, pr.weight, pr.vectors})
        if (!buffer_ok(x)) r.fail(fmt::format("blas prologue buffer {} is not a buffer", x));
      for (int x : {pr.weight, pr.vectors})
        if (!p.buffers.buffers[static_cast<size_t>(x)].derived)
          r.fail(fmt::format("blas prologue buffer {} is not a derived constant", x));
      if (!(pr.eps >= 0.0) || pr.eps > 1.0) r.fail(fmt::format("blas prologue eps {}", pr.eps));
    }
  }
  const uint32_t nconv = r.count("conv step");
  p.conv.resize(nconv);
  for (ConvStep& s : p.conv) {
    const std::string kind = r.str("conv op kind");
    const std::optional<ops::OpKind> ok = ops::op_from_name(kind);
    if (!ok || (*ok != ops::OpKind::conv2d && *ok != ops::OpKind::conv_transpose2d))
      r.fail(fmt::format("conv step op '{}' is not conv2d or conv_transpose2d", kind));
    s.kind = *ok;
    for (int* x : {&s.x, &s.w, &s.bias, &s.out}) *x = r.get<int32_t>("conv operand");
    for (int x : {s.x, s.w, s.out})
      if (!buffer_ok(x)) r.fail(fmt::format("conv operand {} is not a buffer", x));
    if (s.bias != -1 && !buffer_ok(s.bias)) r.fail(fmt::format("conv bias {} is not a buffer", s.bias));
    s.dtype = r.dtype("conv dtype");
    for (auto* v : {&s.x_sizes, &s.w_sizes, &s.out_sizes}) {
      *v = r.exprs("conv size");
      if (v->size() != 4) r.fail(fmt::format("a conv step with {} sizes for a 4-D operand", v->size()));
    }
    for (auto* a : {&s.stride, &s.padding, &s.dilation, &s.output_padding})
      for (int64_t& x : *a) {
        x = r.get<int64_t>("conv parameter");
        if (x < 0 || x > (int64_t{1} << 31)) r.fail(fmt::format("conv parameter {} is out of range", x));
      }
    s.groups = r.get<int64_t>("conv groups");
    if (s.groups < 1 || s.groups > (int64_t{1} << 31)) r.fail(fmt::format("conv groups {} is out of range", s.groups));
  }
  const uint32_t nsteps = r.count("step");
  p.steps.resize(nsteps);
  for (Step& s : p.steps) {
    s.kind = r.small_enum<StepKind>("step kind", kStepKinds);
    s.index = r.get<int32_t>("step index");
    s.release = r.ints("released buffer");
    const size_t limit = s.kind == StepKind::Kernel ? p.kernels.size()
                         : s.kind == StepKind::Blas ? p.blas.size()
                         : s.kind == StepKind::Conv ? p.conv.size()
                                                    : 0;
    if (s.index < 0 || static_cast<size_t>(s.index) >= limit)
      r.fail(fmt::format("step index {} out of range ({} of that kind; host steps are never cached)", s.index, limit));
    for (int b : s.release)
      if (!buffer_ok(b)) r.fail(fmt::format("released buffer {} is not a buffer", b));
    s.prologue_of = r.get<int32_t>("prologue of");
    if (s.prologue_of != -1 && (s.kind != StepKind::Kernel || s.prologue_of < 0 || static_cast<size_t>(s.prologue_of) >= p.blas.size()))
      r.fail(fmt::format("a {} step marked as the prologue of blas step {}", s.kind == StepKind::Kernel ? "kernel" : "non-kernel",
                         s.prologue_of));
  }
  for (size_t i = 0; i < p.blas.size(); ++i) {
    const int ks = p.blas[i].prologue.kernel_step;
    if (ks != -1 && (ks < 0 || static_cast<size_t>(ks) >= p.steps.size() || p.steps[static_cast<size_t>(ks)].prologue_of != static_cast<int>(i)))
      r.fail(fmt::format("blas step {}: its LayerNorm prologue names step {}, which is not marked as its prologue", i, ks));
  }
  for (const PlannedBuffer& b : p.buffers.buffers)
    if (b.derived && std::none_of(p.blas.begin(), p.blas.end(), [&](const BlasStep& s) {
          return s.prologue.weight == b.id || s.prologue.vectors == b.id;
        }))
      r.fail(fmt::format("derived constant buffer {} belongs to no blas step", b.id));
  if (r.pos != body.size()) r.fail(fmt::format("{} bytes after the plan", body.size() - r.pos));
  try {
    derive_prologue_constants(p);
  } catch (const Error& e) {
    r.fail(e.what());
  }
  for (const PlannedBuffer& b : p.buffers.buffers)
    if (b.kind == loop::BufferKind::Input && b.input_index < 0) r.fail(fmt::format("input buffer {} without an input index", b.id));
  return p;
}

}  // namespace protean::backend::cuda
