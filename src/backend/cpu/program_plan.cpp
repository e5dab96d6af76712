#include "backend/cpu/program_plan.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/codegen.h"
#include "backend/kernel_symbols.h"
#include "cache/build_id.h"
#include "backend/plan_codec.h"
#include "ir/graph.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "loop/parse.h"
#include "loop/schedule_cpu.h"
#include "protean/error.h"
#include "protean/version.h"
#include "sym/printer.h"

namespace protean::backend::cpu {

using namespace loop;

namespace {
constexpr char kMagic[] = "PCPUPLN1";

std::string env_or(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::string(e) : std::string("-");
}

using backend::graph_constants;
using Writer = backend::PlanWriter;
using Reader = backend::PlanReader;

// ---- attributes -----------------------------------------------------------------------------------
enum AttrTag : uint8_t { kSymInt = 0, kSymIntVec = 1, kDouble = 2, kBool = 3, kString = 4, kDType = 5 };

void put_symint(Writer& w, const SymInt& v) {
  if (v.is_symbolic()) {
    w.put<uint8_t>(1);
    w.str(sym::print(ir::to_expr(v)));
    w.put<int64_t>(v.hint());
  } else {
    w.put<uint8_t>(0);
    w.put<int64_t>(v.hint());
  }
}

SymInt get_symint(Reader& r) {
  const uint8_t symbolic = r.get<uint8_t>("a size's kind");
  if (symbolic > 1) r.fail("a size of unknown kind");
  if (!symbolic) return SymInt(r.get<int64_t>("an integer"));
  const std::string text = r.str("a size expression");
  const int64_t hint = r.get<int64_t>("a size hint");
  sym::Expr e;
  try {
    e = sym::parse(text);
  } catch (const std::exception& ex) {
    r.fail(fmt::format("size expression '{}': {}", text, ex.what()));
  }
  return ir::from_expr(e, hint);
}

void put_attrs(Writer& w, const ops::Attrs& attrs) {
  w.put<uint32_t>(static_cast<uint32_t>(attrs.items().size()));
  for (const ops::Attr& a : attrs.items()) {
    w.str(a.name);
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, SymInt>) {
            w.put<uint8_t>(kSymInt);
            put_symint(w, v);
          } else if constexpr (std::is_same_v<T, SymIntVec>) {
            w.put<uint8_t>(kSymIntVec);
            w.put<uint32_t>(static_cast<uint32_t>(v.size()));
            for (const SymInt& x : v) put_symint(w, x);
          } else if constexpr (std::is_same_v<T, double>) {
            w.put<uint8_t>(kDouble);
            w.put<uint64_t>(std::bit_cast<uint64_t>(v));
          } else if constexpr (std::is_same_v<T, bool>) {
            w.put<uint8_t>(kBool);
            w.put<uint8_t>(v ? 1 : 0);
          } else if constexpr (std::is_same_v<T, std::string>) {
            w.put<uint8_t>(kString);
            w.str(v);
          } else {
            static_assert(std::is_same_v<T, DType>);
            w.put<uint8_t>(kDType);
            w.str(std::string(short_name(v)));
          }
        },
        a.value);
  }
}

DType get_dtype(Reader& r, const char* what) {
  const std::string name = r.str(what);
  try {
    return parse_dtype(name);
  } catch (const Error&) {
    r.fail(fmt::format("{} '{}' is not a dtype", what, name));
  }
}

ops::Attrs get_attrs(Reader& r) {
  ops::Attrs attrs;
  const uint32_t n = r.count("attribute count", 10);
  for (uint32_t i = 0; i < n; ++i) {
    std::string name = r.str("an attribute name");
    const uint8_t tag = r.get<uint8_t>("an attribute type");
    switch (tag) {
      case kSymInt: attrs.set(std::move(name), get_symint(r)); break;
      case kSymIntVec: {
        const uint32_t k = r.count("a list length", 9);
        SymIntVec v;
        for (uint32_t j = 0; j < k; ++j) v.push_back(get_symint(r));
        attrs.set(std::move(name), std::move(v));
        break;
      }
      case kDouble: attrs.set(std::move(name), std::bit_cast<double>(r.get<uint64_t>("a float"))); break;
      case kBool: attrs.set(std::move(name), r.get<uint8_t>("a bool") != 0); break;
      case kString: attrs.set(std::move(name), r.str("a string")); break;
      case kDType: attrs.set(std::move(name), get_dtype(r, "an attribute dtype")); break;
      default: r.fail(fmt::format("attribute '{}' has an unknown type tag {}", name, tag));  // a byte, not an enum
    }
  }
  return attrs;
}

/// loop::to_text with every constant buffer's sizes printed as `[]`: parse_program allocates a
/// zero-filled tensor of a constant's sizes, which the plan's constant section replaces anyway (the
/// real sizes travel there).
std::string text_without_constant_sizes(const Program& p) {
  Program shell;
  shell.name = p.name;
  shell.symbols = p.symbols;
  shell.buffers = p.buffers;
  for (Buffer& b : shell.buffers)
    if (b.kind == BufferKind::Constant) {
      b.sizes.clear();
      b.constant = Tensor();
    }
  shell.kernels = p.kernels;
  shell.externs = p.externs;
  shell.steps = p.steps;
  shell.outputs = p.outputs;
  shell.num_slots = p.num_slots;
  return to_text(shell);
}

bool has_subgraphs(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (!n.subgraphs.empty()) return true;
  return false;
}
}  // namespace

PlanKey plan_key(const BackendInput& in) {
  PlanKey k;
  if (!in.graph || has_subgraphs(*in.graph)) return k;
  std::string& t = k.text;
  t = fmt::format("protean cpu plan 1\nversion {} build {}\nswitches post_ops={} conv_layout={} dedup={} vectorize={} "
                  "fused_attention={} packed_weights={} merge_dims={} stream_bytes={}\nsymbols",
                  version(), cache::code_build_id(), env_or("PROTEAN_CPU_POST_OPS"), env_or("PROTEAN_CPU_CONV_LAYOUT"),
                  env_or("PROTEAN_CPU_KERNEL_DEDUP"), env_or("PROTEAN_CPU_VECTORIZE"),
                  env_or("PROTEAN_CPU_FUSED_ATTENTION"), env_or("PROTEAN_CPU_PACKED_WEIGHTS"),
                  env_or("PROTEAN_CPU_MERGE_DIMS"), stream_store_min_bytes());
  for (const sym::Expr& s : in.symbols) t += " " + (s ? sym::print(s) : std::string("?"));
  t += "\nasserts\n";
  for (const sym::RuntimeAssert& a : in.runtime_asserts) t += sym::print(a.expr) + " : " + a.message + "\n";
  t += ir::print(*in.graph);
  // Every node's source as run-time errors name it (the program's extern steps carry it: loop::Extern::
  // where); the IR's comments hold only file:line.
  t += "\nlocations\n";
  for (const ir::Node& n : in.graph->nodes()) t += n.loc.describe() + "\n";
  t += "\nconstants\n";
  for (const Tensor* c : graph_constants(*in.graph)) {
    if (!c->defined() || c->is_fake() || c->device().type != DeviceType::CPU) return PlanKey{};
    Tensor dense = c->contiguous();
    const size_t n = static_cast<size_t>(dense.int_numel()) * dense.itemsize();
    t += fmt::format("{} {} {} {} {:016x}\n", short_name(c->dtype()), ir::symints_text(c->sizes()),
                     ir::symints_text(c->strides()), ir::symint_text(c->storage_offset()),
                     n ? XXH3_64bits(dense.data_ptr(), n) : uint64_t{0});
  }
  k.key = XXH3_64bits(t.data(), t.size());
  k.cacheable = true;
  return k;
}

std::string encode_plan(const Program& p, const ir::Graph& g, const std::string& source,
                        const std::vector<std::vector<int>>& kernel_buffers, int unique_kernels,
                        const loop::ScheduleStats& schedule) {
  Writer w;
  w.out.append(kMagic, 8);
  w.str(text_without_constant_sizes(p));
  w.str(source);
  w.put<uint8_t>(large_program(p) ? 1 : 0);
  w.put<int32_t>(unique_kernels);
  for (int v : {schedule.kernels_before, schedule.kernels_after, schedule.reductions_to_locals, schedule.stashed_reductions,
                schedule.horizontal_fusions, schedule.reciprocal_divisions, schedule.slots, schedule.temp_buffers,
                schedule.extern_slot_buffers})
    w.put<int32_t>(v);
  w.put<uint32_t>(static_cast<uint32_t>(kernel_buffers.size()));
  for (const auto& kb : kernel_buffers) {
    w.put<uint32_t>(static_cast<uint32_t>(kb.size()));
    for (int b : kb) w.put<int32_t>(b);
  }
  w.put<uint32_t>(static_cast<uint32_t>(p.externs.size()));
  for (const Extern& e : p.externs) put_attrs(w, e.attrs);
  const std::vector<const Tensor*> gc = graph_constants(g);
  uint32_t nconst = 0;
  for (const Buffer& b : p.buffers) nconst += b.kind == BufferKind::Constant;
  w.put<uint32_t>(nconst);
  for (const Buffer& b : p.buffers) {
    if (b.kind != BufferKind::Constant) continue;
    w.put<int32_t>(b.id);
    w.put<uint32_t>(static_cast<uint32_t>(b.sizes.size()));
    for (const sym::Expr& d : b.sizes) w.put<int64_t>(d->value);
    const Tensor& c = b.constant;
    const size_t n = static_cast<size_t>(c.int_numel()) * c.itemsize();
    int64_t ref = -1;
    if (c.is_contiguous())
      for (size_t i = 0; i < gc.size() && ref < 0; ++i)
        if (gc[i]->defined() && !gc[i]->is_fake() && gc[i]->dtype() == c.dtype() && gc[i]->is_contiguous() &&
            gc[i]->int_sizes() == c.int_sizes() && (n == 0 || gc[i]->data_ptr() == c.data_ptr()))
          ref = static_cast<int64_t>(i);
    if (ref >= 0) {
      w.put<uint8_t>(0);  // the graph's constant number `ref`
      w.put<uint32_t>(static_cast<uint32_t>(ref));
    } else {
      w.put<uint8_t>(1);  // bytes
      Tensor dense = c.contiguous();
      w.bytes(n ? dense.data_ptr() : nullptr, n);
    }
  }
  return w.out;
}

Plan decode_plan(const std::string& bytes, const BackendInput& in, const ir::Graph& g) {
  Reader r{bytes, 0, "cpu program plan"};
  if (bytes.size() < 8 || bytes.compare(0, 8, kMagic, 8) != 0) r.fail("not a cpu program plan (no PCPUPLN1 magic)");
  r.pos = 8;
  Plan plan;
  const std::string text = r.str("the program text");
  plan.program = parse_program(text);  // FormatError, or the verifier's CompileError
  Program& p = plan.program;
  plan.source = r.str("the translation unit");
  const bool large = r.get<uint8_t>("the large-program flag") != 0;
  plan.unique_kernels = r.get<int32_t>("the distinct kernel count");
  for (int* v : {&plan.schedule.kernels_before, &plan.schedule.kernels_after, &plan.schedule.reductions_to_locals,
                 &plan.schedule.stashed_reductions, &plan.schedule.horizontal_fusions, &plan.schedule.reciprocal_divisions,
                 &plan.schedule.slots, &plan.schedule.temp_buffers, &plan.schedule.extern_slot_buffers})
    *v = r.get<int32_t>("the schedule counters");
  const uint32_t nkb = r.count("the kernel buffer tables", 4);
  if (nkb != 0 && nkb != p.kernels.size())
    r.fail(fmt::format("{} kernel buffer tables for {} kernels", nkb, p.kernels.size()));
  for (uint32_t k = 0; k < nkb; ++k) {
    const uint32_t n = r.count("a kernel buffer table", 4);
    std::vector<int> kb;
    for (uint32_t j = 0; j < n; ++j) {
      const int32_t b = r.get<int32_t>("a buffer id");
      if (b < 0 || static_cast<size_t>(b) >= p.buffers.size()) r.fail(fmt::format("kernel {} names buffer {}", k, b));
      kb.push_back(b);
    }
    plan.kernel_buffers.push_back(std::move(kb));
  }
  if (plan.unique_kernels < 0 || static_cast<size_t>(plan.unique_kernels) > p.kernels.size())
    r.fail(fmt::format("{} distinct kernels of {}", plan.unique_kernels, p.kernels.size()));
  const uint32_t next = r.count("the extern count", 4);
  if (next != p.externs.size()) r.fail(fmt::format("attributes of {} externs for {} extern steps", next, p.externs.size()));
  for (Extern& e : p.externs) e.attrs = get_attrs(r);
  const std::vector<const Tensor*> gc = graph_constants(g);
  std::vector<bool> filled(p.buffers.size(), false);
  const uint32_t nconst = r.count("the constant count", 9);
  for (uint32_t i = 0; i < nconst; ++i) {
    const int32_t id = r.get<int32_t>("a constant's buffer id");
    if (id < 0 || static_cast<size_t>(id) >= p.buffers.size() || p.buffers[static_cast<size_t>(id)].kind != BufferKind::Constant ||
        filled[static_cast<size_t>(id)])
      r.fail(fmt::format("constant {} names buffer {}, not an unfilled constant buffer", i, id));
    Buffer& b = p.buffers[static_cast<size_t>(id)];
    filled[static_cast<size_t>(id)] = true;
    const uint32_t rank = r.count("a constant's rank", 8);
    IntVec shape;
    int64_t numel = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      const int64_t n = r.get<int64_t>("a constant's size");
      if (n < 0 || (n > 0 && numel > (int64_t{1} << 40) / n)) r.fail(fmt::format("buffer b{} has size {}", id, n));
      numel *= n;
      shape.push_back(n);
    }
    b.sizes.clear();
    for (int64_t n : shape) b.sizes.push_back(sym::integer(n));
    const uint8_t mode = r.get<uint8_t>("a constant's kind");
    if (mode == 0) {
      const uint32_t ref = r.get<uint32_t>("a graph constant number");
      if (ref >= gc.size()) r.fail(fmt::format("buffer b{} is graph constant {} of {}", id, ref, gc.size()));
      const Tensor& c = *gc[ref];
      if (!c.defined() || c.is_fake() || c.dtype() != b.dtype || !c.is_contiguous() || c.int_sizes() != shape)
        r.fail(fmt::format("buffer b{} ({} of {} elements) does not fit graph constant {}", id, short_name(b.dtype), numel, ref));
      b.constant = c;
    } else if (mode == 1) {
      const uint64_t n = r.get<uint64_t>("a constant's byte count");
      if (n != static_cast<uint64_t>(numel) * itemsize(b.dtype))
        r.fail(fmt::format("buffer b{} holds {} bytes, {} of {} elements need {}", id, n, short_name(b.dtype), numel,
                           static_cast<uint64_t>(numel) * itemsize(b.dtype)));
      r.need(n, "a constant's bytes");
      b.constant = empty(shape, b.dtype);
      if (n) std::memcpy(b.constant.data_ptr(), bytes.data() + r.pos, static_cast<size_t>(n));
      r.pos += static_cast<size_t>(n);
    } else {
      r.fail(fmt::format("buffer b{} has a constant of unknown kind {}", id, mode));
    }
  }
  for (size_t i = 0; i < p.buffers.size(); ++i)
    if (p.buffers[i].kind == BufferKind::Constant && !filled[i]) r.fail(fmt::format("constant buffer b{} has no data", i));
  if (r.pos != bytes.size()) r.fail(fmt::format("{} bytes after the plan", bytes.size() - r.pos));

  // Fit to this graph: the dispatcher's symbols lead the program's, the inputs are the graph's.
  const std::vector<sym::Expr> want = kernel_symbols(in);
  if (want != p.symbols) r.fail("the plan's size symbols are not this graph's");
  const size_t ninputs = in.graph->inputs().size();
  for (const Buffer& b : p.buffers)
    if (b.kind == BufferKind::Input && (b.input_index < 0 || static_cast<size_t>(b.input_index) >= ninputs))
      r.fail(fmt::format("buffer b{} is input {} of a graph with {}", b.id, b.input_index, ninputs));
  if (p.outputs.size() != in.graph->outputs().size())
    r.fail(fmt::format("{} outputs for a graph with {}", p.outputs.size(), in.graph->outputs().size()));
  if (large != large_program(p)) r.fail("the large-program flag does not match the program");
  return plan;
}

}  // namespace protean::backend::cpu
