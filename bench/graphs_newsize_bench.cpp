// Host time of a new size inside a known bucket under mode "reduce-overhead" (backend/cuda/graphs.h),
// measured on the fake driver (device/fake_driver.h), so it runs on any machine:
//
//   graphs_newsize_bench [LAYERS] [CALLS] [--cold] [--sizes-in-memory]     (defaults 12 and 400)
//
// The program is hand-built with the shape of GPT-2 small's (docs/graphs.md): per layer six generated
// kernels (two LayerNorms, the fused attention, three pointwise kernels) and four Linear calls padded
// to the bucket's bound (QKV, output projection, FC1, FC2), an embedding kernel that reads the graph
// input first and a final LayerNorm that writes the output last: 12 layers are 122 steps, 74 kernel
// nodes and 48 library nodes. Every temporary has its own arena region. The kernels do nothing (the
// fake driver runs no code); cuBLASLt is a test hook that launches one fake kernel per call.
//
// After one call records the bucket [65, 128], CALLS calls alternate between lengths 65..128, so each
// is a new size of the bucket (every kernel node is patched). Prints one JSON object with the medians
// and worst cases, over those calls, of the graph runner's own figures (the `new sizes` line of
// PROTEAN_LOGS=graphs and backend::graph_stats()): the size checks, the host time until the first
// chunk's launch (the critical path: the device starts no earlier), the patches (of which the fake
// driver's cuGraphExecKernelNodeSetParams), the launches, and the whole call as the caller sees it.
// With --cold, 64 MiB are written before each call, so the call starts with the runner's data out of
// the caches (as after the host waited for the device while other work ran).
// With --sizes-in-memory the kernels take a pointer to the sizes in memory (ParamKind::Sizes, what
// the cuda backend compiles for these modes: codegen.h SizeArgs::FromMemory) instead of the size by
// value: their nodes are launched at the bucket's bound and a new size patches only what changed
// otherwise (the input's and output's kernels, a flipped variant).
// The fake driver's own costs are not the H200's: what compares across builds is the runner's part
// (checks, patch minus driver) and the number of nodes patched before the first launch.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "backend/cuda/blas.h"
#include "backend/cuda/program.h"
#include "backend/cuda/runner.h"
#include "backend/graph_stats.h"
#include "device/fake_driver.h"
#include "observe/log.h"
#include "protean/ops.h"
#include "protean/protean.h"
#include "sym/expr.h"

namespace pt = protean;
namespace drv = protean::cuda;
namespace bc = protean::backend::cuda;
namespace sy = protean::sym;

namespace {

using K = pt::loop::BufferKind;

struct Builder {
  std::shared_ptr<bc::CudaProgram> p = std::make_shared<bc::CudaProgram>();
  sy::Expr s0 = sy::symbol("s0");
  std::vector<std::string> entries;
  bool sizes_in_memory = false;

  int buffer(K kind, sy::Expr bytes, pt::DType dt = pt::DType::BF16) {
    bc::PlannedBuffer b;
    b.id = static_cast<int>(p->buffers.buffers.size());
    b.dtype = dt;
    b.sizes = {bytes};
    b.bytes = bytes;
    b.kind = kind;
    if (kind == K::Constant) b.constant = pt::zeros({4}, pt::DType::F32);  // the kernels read nothing
    p->buffers.buffers.push_back(b);
    return b.id;
  }
  sy::Expr rows(int64_t width) { return sy::mul(s0, sy::integer(width)); }
  // A kernel over `work` (elements, or rows for a row kernel of `row` elements) reading `src`, writing `dst`.
  void kernel(const std::string& name, int src, int dst, sy::Expr work, int64_t row = 0) {
    bc::CudaKernel k;
    k.name = name;
    k.aligned.entry = name + "_aligned";
    k.general.entry = name + "_general";
    for (auto* v : {&k.aligned, &k.general}) {
      v->launch.shape = row ? bc::LaunchShape::BlockPerRow : bc::LaunchShape::GridStride;
      v->launch.work = work;
      v->launch.block_threads = row ? 256 : 128;
      if (row) {
        v->launch.row_length = sy::integer(row);
        v->launch.row_capacity = 1024;
      }
    }
    k.aligned.launch.items_per_thread = 8;
    k.rule.divisible = {work};
    k.rule.multiple = 8;
    k.rule.aligned_buffers = {src, dst};
    k.params = {{bc::ParamKind::Buffer, src, 0, 8}, {bc::ParamKind::Buffer, dst, 8, 8},
                sizes_in_memory ? bc::KernelParam{bc::ParamKind::Sizes, -1, 16, 8} : bc::KernelParam{bc::ParamKind::Symbol, 0, 16, 8}};
    k.arg_block_bytes = 24;
    entries.push_back(k.aligned.entry);
    entries.push_back(k.general.entry);
    p->steps.push_back(bc::Step{bc::StepKind::Kernel, static_cast<int>(p->kernels.size()), {src}});
    p->kernels.push_back(std::move(k));
  }
  // Linear a[s0, k] · w[n, k]ᵀ (+ bias, + residual) → out[s0, n], padded (arena and constant operands).
  void linear(int a, int out, int64_t n, int64_t k, int residual = -1) {
    bc::BlasStep b;
    b.op = bc::BlasOp::Linear;
    b.kind = pt::ops::OpKind::linear;
    b.dtype = pt::DType::BF16;
    b.a = a, b.out = out;
    b.b = buffer(K::Constant, sy::integer(n * k * 2));
    b.epilogue.bias = buffer(K::Constant, sy::integer(n * 2));
    b.epilogue.residual = residual;
    if (residual >= 0) b.epilogue.beta = 1.0;
    b.transpose_b = true;
    b.batch = sy::integer(1), b.m = s0, b.n = sy::integer(n), b.k = sy::integer(k);
    b.batch_stride_a = b.batch_stride_b = sy::integer(0);
    p->steps.push_back(bc::Step{bc::StepKind::Blas, static_cast<int>(p->blas.size()), {a}});
    p->blas.push_back(b);
  }
};

std::shared_ptr<bc::CudaProgram> gpt2_shaped(int layers, std::vector<std::string>& entries, bool sizes_in_memory) {
  Builder B;
  B.sizes_in_memory = sizes_in_memory;
  B.p->name = "gpt2-shaped";
  B.p->cubin = {'f', 'a', 'k', 'e', 0};
  B.p->symbols = {B.s0};
  const int64_t H = 768;
  auto temp = [&](int64_t width) { return B.buffer(K::Temp, B.rows(width * 2)); };
  const int ids = B.buffer(K::Input, B.rows(8), pt::DType::I64);
  B.p->buffers.buffers[static_cast<size_t>(ids)].input_index = 0;
  int h = temp(H);
  B.kernel("embed", ids, h, B.rows(H));
  for (int l = 0; l < layers; ++l) {
    const std::string L = fmt::format("l{}_", l);
    const int ln1 = temp(H), qkv = temp(3 * H), att = temp(H), h1 = temp(H), ln2 = temp(H), fc1 = temp(4 * H),
              act = temp(4 * H), h2 = temp(H), q = temp(3 * H), h3 = temp(H);
    B.kernel(L + "ln1", h, ln1, B.s0, H);
    B.linear(ln1, qkv, 3 * H, H);
    B.kernel(L + "split", qkv, q, B.rows(3 * H));
    B.kernel(L + "attention", q, att, B.rows(12));
    B.linear(att, h1, H, H, h);
    B.kernel(L + "ln2", h1, ln2, B.s0, H);
    B.linear(ln2, fc1, 4 * H, H);
    B.kernel(L + "gelu", fc1, act, B.rows(4 * H));
    B.linear(act, h2, H, 4 * H, h1);
    B.kernel(L + "residual", h2, h3, B.rows(H));
    h = h3;
  }
  const int out = B.buffer(K::Output, B.rows(H * 2));
  B.p->buffers.buffers[static_cast<size_t>(out)].output_index = 0;
  B.p->buffers.outputs = {out};
  B.kernel("ln_f", h, out, B.s0, H);
  entries = B.entries;
  return B.p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
double worst(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool cold = std::find(args.begin(), args.end(), "--cold") != args.end();
  args.erase(std::remove(args.begin(), args.end(), "--cold"), args.end());
  const bool in_memory = std::find(args.begin(), args.end(), "--sizes-in-memory") != args.end();
  args.erase(std::remove(args.begin(), args.end(), "--sizes-in-memory"), args.end());
  const int layers = args.size() > 0 ? std::atoi(args[0].c_str()) : 12;
  const int calls = args.size() > 1 ? std::atoi(args[1].c_str()) : 400;
  std::vector<char> flush(cold ? size_t(64) << 20 : 0);
  if (layers < 1 || calls < 1) {
    std::fprintf(stderr, "usage: graphs_newsize_bench [LAYERS >= 1] [CALLS >= 1] [--cold] [--sizes-in-memory]\n");
    return 2;
  }
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);  // the fake driver is not thread-safe
  drv::FakeDriver fake;
  std::vector<std::string> entries;
  auto program = gpt2_shaped(layers, entries, in_memory);
  for (const std::string& e : entries) fake.define_kernel(e, {8, 8, 8});
  bc::set_fake_blas_hook_for_testing(fake, 1);
  pt::backend::BackendInput in;
  in.symbols = {sy::symbol("s0")};
  in.compile_id = "0/0";
  in.mode = "reduce-overhead";
  in.buckets.ranges = std::vector<pt::backend::BackendInput::SymbolRange>(1);
  auto art = bc::make_cuda_artifact(program, in);
  std::vector<pt::Tensor> ids;
  for (int64_t n = 65; n <= 128; ++n) ids.push_back(pt::zeros({n}, pt::DType::I64).to(pt::kCUDA));
  auto call = [&](size_t i) {
    const int64_t n = ids[i].size(0).hint();
    return art->run({&ids[i], 1}, std::vector<int64_t>{n});
  };
  call(0);  // records the bucket [65, 128]
  std::vector<double> total, checks, first, patch, driver, launch, first_nodes, patched, wall;
  std::string log;
  const std::regex line(
      R"(: ([\d.]+) us on the host \(checks ([\d.]+) us over (\d+) size expressions, (\d+) node\(s\) patched in ([\d.]+) us of which the driver ([\d.]+) us, (\d+) launch\(es\) ([\d.]+) us(?:; first launch after ([\d.]+) us, (\d+) node\(s\) patched before it)?)");
  size_t exprs = 0, chunks = 0;
  for (int c = 0; c < calls; ++c) {
    const size_t i = static_cast<size_t>((c * 37 + 1) % static_cast<int>(ids.size()));  // never the previous length
    fake.clear_launches();
    for (size_t b = 0; b < flush.size(); b += 64) flush[b] = static_cast<char>(b + static_cast<size_t>(c));
    std::string text;
    {
      pt::observe::LogCapture cap("graphs");
      const auto t1 = std::chrono::steady_clock::now();
      call(i);
      wall.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count());
      text = cap.str();
    }
    std::smatch m;
    if (!std::regex_search(text, m, line)) {
      std::fprintf(stderr, "no `new sizes` line for call %d:\n%s\n", c, text.c_str());
      return 1;
    }
    total.push_back(std::stod(m[1]));
    checks.push_back(std::stod(m[2]));
    exprs = std::stoul(m[3]);
    patched.push_back(std::stod(m[4]));
    patch.push_back(std::stod(m[5]));
    driver.push_back(std::stod(m[6]));
    chunks = std::stoul(m[7]);
    launch.push_back(std::stod(m[8]));
    if (m[9].matched) {
      first.push_back(std::stod(m[9]));
      first_nodes.push_back(std::stod(m[10]));
    }
    if (c == 0) log = text;
  }
  bc::set_blas_hook_for_testing({});
  std::vector<double> own;  // the runner's own patch work: patch time less the driver's
  for (size_t i = 0; i < patch.size(); ++i) own.push_back(patch[i] - driver[i]);
  auto stat = [](const char* name, const std::vector<double>& v) {
    return fmt::format("\"{}\": {{\"median\": {:.2f}, \"worst\": {:.2f}}}", name, median(v), worst(v));
  };
  std::printf("%s\n",
              fmt::format("{{\"bench\": \"graphs_newsize\", \"layers\": {}, \"cold\": {}, \"sizes_in_memory\": {}, \"steps\": {}, \"kernel_nodes\": {}, \"library_nodes\": {}, "
                          "\"calls\": {}, \"size_expressions\": {}, \"chunks\": {}, \"units\": \"us\",\n {},\n {},\n {},\n {},\n {},\n "
                          "{},\n {},\n {},\n {},\n {},\n \"first_log_line\": \"{}\"}}",
                          layers, cold, in_memory, program->steps.size(), program->kernels.size(), program->blas.size(), calls, exprs, chunks,
                          stat("call_wall", wall), stat("runner_total", total), stat("checks", checks),
                          stat("first_launch_after", first), stat("nodes_patched", patched),
                          stat("nodes_patched_before_first_launch", first_nodes),
                          stat("patch", patch), stat("patch_driver", driver), stat("patch_runner_own", own),
                          stat("launches", launch), std::regex_replace(log.substr(0, log.find('\n')), std::regex("\""), "'"))
                  .c_str());
  return 0;
}
