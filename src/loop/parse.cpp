#include "loop/parse.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "loop/verify.h"
#include "protean/error.h"
#include "sym/printer.h"

namespace protean::loop {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

/// Splits `s` at `sep` where no parenthesis or bracket is open.
std::vector<std::string_view> split_top(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
    else if (depth == 0 && s.substr(i, sep.size()) == sep) {
      out.push_back(trim(s.substr(start, i - start)));
      i += sep.size() - 1;
      start = i + 1;
    }
  }
  out.push_back(trim(s.substr(start)));
  return out;
}

/// Position of the bracket closing the one opened at `open` (s[open] is '(' or '['), or npos.
size_t closing(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '(' || s[i] == '[' || s[i] == '{') ++depth;
    else if (s[i] == ')' || s[i] == ']' || s[i] == '}') {
      if (--depth == 0) return i;
    }
  }
  return std::string_view::npos;
}

class Parser {
 public:
  explicit Parser(std::string_view text) {
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      lines_.push_back(text.substr(start, end - start));
      start = end + 1;
    }
  }

  Program run() {
    Program p;
    next_line();
    expect_prefix("program ");
    {
      std::string_view l = cur_.substr(8);
      const size_t paren = l.rfind(" (symbols:");
      if (paren == std::string_view::npos || l.back() != ')') fail("'program NAME (symbols: ...)'");
      p.name = std::string(l.substr(0, paren));
      std::string_view syms = trim(l.substr(paren + 10, l.size() - paren - 11));
      for (std::string_view s : split_top(syms, " "))
        if (!s.empty()) p.symbols.push_back(sym_expr(s));
    }
    int max_slot = -1;
    while (next_line()) {
      std::string_view l = trim(cur_);
      if (l.empty()) continue;
      if (starts_with(l, "return")) {
        for (std::string_view b : split_top(trim(l.substr(6)), " "))
          if (!b.empty()) p.outputs.push_back(buffer_ref(b));
        p.num_slots = max_slot + 1;
        for (size_t i = 0; i < p.kernels.size(); ++i) p.kernels[i].name = p.kernels[i].name.empty() ? fmt::format("kernel{}", i) : p.kernels[i].name;
        verify(p, "parsed from text");
        return p;
      }
      if (starts_with(l, "release ")) {
        if (p.steps.empty()) fail("a step before 'release'");
        for (std::string_view b : split_top(trim(l.substr(8)), " ")) p.steps.back().release.push_back(buffer_ref(b));
      } else if (starts_with(l, "extern ")) {
        p.steps.push_back({false, static_cast<int>(p.externs.size()), {}});
        p.externs.push_back(extern_step(l.substr(7)));
      } else if (starts_with(l, "kernel")) {
        p.steps.push_back({true, static_cast<int>(p.kernels.size()), {}});
        p.kernels.push_back(kernel(l, p));
      } else if (l.size() > 1 && l[0] == 'b' && l.find(" : ") != std::string_view::npos) {
        p.buffers.push_back(buffer(l, p.buffers.size()));
        max_slot = std::max(max_slot, p.buffers.back().slot);
      } else {
        fail("a buffer, kernel, extern, release or return line");
      }
    }
    fail("'return ...' at the end");
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw FormatError(fmt::format("loop parse error at line {}: expected {}, got '{}'", line_no_, expected, cur_));
  }
  bool next_line() {
    if (line_no_ >= lines_.size()) return false;
    cur_ = lines_[line_no_++];
    return true;
  }
  void expect_prefix(std::string_view p) const {
    if (!starts_with(cur_, p)) fail(fmt::format("'{}'", p));
  }
  sym::Expr sym_expr(std::string_view s) const {
    try {
      return sym::parse(trim(s));
    } catch (const std::exception& e) {
      fail(fmt::format("a size expression ({})", e.what()));
    }
  }
  std::vector<sym::Expr> sizes(std::string_view s) const {
    s = trim(s);
    if (s.size() < 2 || s.front() != '[' || s.back() != ']') fail("a '[...]' list of sizes");
    std::vector<sym::Expr> out;
    std::string_view in = trim(s.substr(1, s.size() - 2));
    if (in.empty()) return out;
    for (std::string_view e : split_top(in, ",")) out.push_back(sym_expr(e));
    return out;
  }
  int buffer_ref(std::string_view s) const {
    s = trim(s);
    int v = -1;
    if (s.size() < 2 || s[0] != 'b' || std::from_chars(s.data() + 1, s.data() + s.size(), v).ec != std::errc() || v < 0)
      fail(fmt::format("a buffer name bN, not '{}'", s));
    return v;
  }
  DType dtype(std::string_view s) const {
    try {
      return parse_dtype(s);
    } catch (const std::exception&) {
      fail(fmt::format("a dtype, not '{}'", s));
    }
  }
  /// `bN[index]` → (N, index).
  std::pair<int, sym::Expr> element(std::string_view s) const {
    s = trim(s);
    const size_t lb = s.find('[');
    if (lb == std::string_view::npos || s.back() != ']') fail(fmt::format("an element bN[index], not '{}'", s));
    return {buffer_ref(s.substr(0, lb)), sym_expr(s.substr(lb + 1, s.size() - lb - 2))};
  }

  Buffer buffer(std::string_view l, size_t pos) const {
    Buffer b;
    const size_t colon = l.find(" : ");
    b.id = buffer_ref(l.substr(0, colon));
    if (b.id != static_cast<int>(pos)) fail(fmt::format("buffer b{}", pos));
    std::string_view rest = l.substr(colon + 3);
    const size_t lb = rest.find('['), rb = closing(rest, lb);
    if (lb == std::string_view::npos || rb == std::string_view::npos) fail("'dtype[sizes]'");
    b.dtype = dtype(rest.substr(0, lb));
    b.sizes = sizes(rest.substr(lb, rb - lb + 1));
    std::vector<std::string_view> words = split_top(trim(rest.substr(rb + 1)), " ");
    if (words.empty()) fail("a buffer kind");
    if (words[0] == "input") b.kind = BufferKind::Input;
    else if (words[0] == "constant") b.kind = BufferKind::Constant;
    else if (words[0] == "temp") b.kind = BufferKind::Temp;
    else if (words[0] == "output") b.kind = BufferKind::Output;
    else fail("input, constant, temp or output");
    for (size_t i = 1; i < words.size(); ++i) {
      std::string_view w = words[i];
      if (starts_with(w, "#")) {
        if (std::from_chars(w.data() + 1, w.data() + w.size(), b.input_index).ec != std::errc()) fail("'#N' (input index)");
      } else if (starts_with(w, "slot")) {
        if (std::from_chars(w.data() + 4, w.data() + w.size(), b.slot).ec != std::errc()) fail("'slotN'");
      } else if (w == "extern") {
        b.from_extern = true;
      } else if (w == "into" && i + 1 < words.size()) {
        const auto [alias, offset] = element(words[++i]);
        b.alias = alias;
        if (!offset->is_integer() || offset->value < 0) fail("'into bN[offset]' with a constant offset");
        b.alias_offset = offset->value;
      } else {
        fail(fmt::format("'#N', 'slotN', 'extern' or 'into bN[offset]', not '{}'", w));
      }
    }
    if (b.kind == BufferKind::Constant) {
      // the text form does not hold constant data: a zero-filled tensor of the (static) shape
      std::vector<int64_t> shape;
      for (const auto& s : b.sizes) {
        if (!s->is_integer()) fail("a constant buffer with static sizes");
        shape.push_back(s->value);
      }
      b.constant = zeros(shape, b.dtype);
    }
    return b;
  }

  Extern extern_step(std::string_view l) const {
    Extern e;
    const size_t lp = l.find('('), rp = closing(l, lp);
    if (lp == std::string_view::npos || rp == std::string_view::npos) fail("'extern op(inputs) -> outputs'");
    const std::string name(l.substr(0, lp));
    const auto op = ops::op_from_name(name);
    if (!op) fail(fmt::format("an op name, not '{}'", name));
    e.op = *op;
    std::string_view ins = trim(l.substr(lp + 1, rp - lp - 1));
    for (std::string_view i : ins.empty() ? std::vector<std::string_view>{} : split_top(ins, ",")) {
      i = trim(i);
      if (starts_with(i, "view(")) {
        // view(bN, [sizes], [strides], offset)
        const size_t vr = closing(i, 4);
        if (vr == std::string_view::npos || vr + 1 != i.size()) fail("'view(bN, [sizes], [strides], offset)'");
        std::vector<std::string_view> parts = split_top(i.substr(5, vr - 5), ",");
        if (parts.size() != 4) fail("a view of a buffer, its sizes, its strides and its offset");
        e.views.resize(e.inputs.size());
        e.inputs.push_back(buffer_ref(parts[0]));
        ExternView v;
        v.sizes = sizes(parts[1]);
        v.strides = sizes(parts[2]);
        if (v.sizes.size() != v.strides.size()) fail("a view with as many strides as sizes");
        v.offset = sym_expr(parts[3]);
        e.views.push_back(std::move(v));
      } else {
        e.inputs.push_back(i == "None" ? -1 : buffer_ref(i));
      }
    }
    if (!e.views.empty()) e.views.resize(e.inputs.size());
    std::string_view rest = trim(l.substr(rp + 1));
    if (!starts_with(rest, "->")) fail("'->' after the extern's inputs");
    rest = trim(rest.substr(2));
    if (rest.find("(runs the compiled program") != std::string_view::npos)
      fail("no cond extern (the text does not hold its branch programs)");
    // ` at="..."` (Extern::where: no double quote inside) comes after the outputs and the post-ops
    if (const size_t at = rest.rfind(" at=\""); at != std::string_view::npos) {
      const std::string_view w = rest.substr(at + 5);
      if (w.empty() || w.back() != '"') fail("a closing '\"' after at=");
      e.where = std::string(w.substr(0, w.size() - 1));
      rest = rest.substr(0, at);
    }
    const size_t post = rest.find(" post_ops=\"");
    std::string_view outs = post == std::string_view::npos ? rest : rest.substr(0, post);
    for (std::string_view o : split_top(trim(outs), " "))
      if (!o.empty()) e.outputs.push_back(buffer_ref(o));
    if (post != std::string_view::npos) {
      std::string_view v = rest.substr(post + 11);
      if (v.empty() || v.back() != '"') fail("a closing '\"' after post_ops");
      e.attrs.set("post_ops", std::string(v.substr(0, v.size() - 1)));
    }
    return e;
  }

  // ---- scalar expressions -------------------------------------------------------------------------
  struct ExprCtx {
    const Program& p;
    const std::map<std::string, DType>& locals;
  };

  SExpr expr(std::string_view s, const ExprCtx& c) const {
    s = trim(s);
    if (s.empty()) fail("an expression");
    const size_t lp = s.find('(');
    // a constant `v:dtype`, a local, or a call `name(args)` possibly followed by `:dtype` (index)
    if (lp == std::string_view::npos) {
      const size_t colon = s.rfind(':');
      if (colon != std::string_view::npos) return constant(s.substr(0, colon), dtype(s.substr(colon + 1)));
      auto it = c.locals.find(std::string(s));
      if (it == c.locals.end()) fail(fmt::format("a local an earlier reduction defines, a call or a typed constant, not '{}'", s));
      return s_local(std::string(s), it->second);
    }
    const size_t rp = closing(s, lp);
    if (rp == std::string_view::npos) fail(fmt::format("a ')' closing '{}'", s));
    const std::string_view name = s.substr(0, lp), inner = s.substr(lp + 1, rp - lp - 1), tail = s.substr(rp + 1);
    if (name == "index") {
      DType t = DType::I64;
      if (!tail.empty()) {
        if (tail[0] != ':') fail("':dtype' after index(...)");
        t = dtype(tail.substr(1));
      }
      SNode n;
      n.op = SOp::Index;
      n.dtype = t;
      n.index = sym_expr(inner);
      return std::make_shared<const SNode>(std::move(n));
    }
    if (!tail.empty()) fail(fmt::format("nothing after '{}'", s.substr(0, rp + 1)));
    if (name == "load") {
      const size_t comma = inner.find(',');
      if (comma == std::string_view::npos) fail("'load(bN, index)'");
      const int b = buffer_ref(inner.substr(0, comma));
      if (static_cast<size_t>(b) >= c.p.buffers.size()) fail(fmt::format("a declared buffer, not b{}", b));
      return s_load(b, c.p.buffers[static_cast<size_t>(b)].dtype, sym_expr(inner.substr(comma + 1)));
    }
    std::vector<SExpr> args;
    for (std::string_view a : split_top(inner, ",")) args.push_back(expr(a, c));
    auto nargs = [&](size_t n) {
      if (args.size() != n) fail(fmt::format("{} operands of {}", n, name));
    };
    if (name == "where") {
      nargs(3);
      SNode n;
      n.op = SOp::Where;
      n.dtype = args[1]->dtype;
      n.args = args;
      return std::make_shared<const SNode>(std::move(n));
    }
    if (name == "fma") {
      nargs(3);
      SNode n;
      n.op = SOp::Fma;
      n.dtype = args[0]->dtype;
      n.args = args;
      return std::make_shared<const SNode>(std::move(n));
    }
    if (auto fn = scalar_from_name(name)) {
      nargs(static_cast<size_t>(scalar_arity(*fn)));
      const ScalarOp f = *fn;
      const bool boolean = f == ScalarOp::eq || f == ScalarOp::ne || f == ScalarOp::lt || f == ScalarOp::le || f == ScalarOp::gt ||
                           f == ScalarOp::ge || f == ScalarOp::logical_and || f == ScalarOp::logical_or || f == ScalarOp::logical_not;
      const DType t = boolean ? DType::Bool : args[0]->dtype;
      return args.size() == 1 ? s_unary(f, args[0], t) : s_binary(f, args[0], args[1], t);
    }
    // a cast: the target dtype's short name
    nargs(1);
    SNode n;
    n.op = SOp::Cast;
    n.dtype = dtype(name);
    n.args = args;
    return std::make_shared<const SNode>(std::move(n));
  }

  SExpr constant(std::string_view v, DType t) const {
    SNode n;
    n.op = SOp::Const;
    n.dtype = t;
    if (is_floating(t)) {
      if (v == "nan" || v == "-nan") n.fval = std::numeric_limits<double>::quiet_NaN();
      else if (v == "inf") n.fval = std::numeric_limits<double>::infinity();
      else if (v == "-inf") n.fval = -std::numeric_limits<double>::infinity();
      else if (std::from_chars(v.data(), v.data() + v.size(), n.fval).ec != std::errc()) fail(fmt::format("a number, not '{}'", v));
    } else if (std::from_chars(v.data(), v.data() + v.size(), n.ival).ec != std::errc()) {
      fail(fmt::format("an integer, not '{}'", v));
    }
    return std::make_shared<const SNode>(std::move(n));
  }

  // ---- kernels ------------------------------------------------------------------------------------
  Kernel kernel(std::string_view l, const Program& p) {
    Kernel k;
    const size_t over = l.find(" over ");
    if (over == std::string_view::npos || l.back() != ':') fail("'kernelN over [sizes]:'");
    k.name = std::string(l.substr(0, over));
    k.outer = sizes(l.substr(over + 6, l.size() - over - 7));
    std::map<std::string, DType> locals;
    std::vector<std::string> stage_sched;
    bool scheduled = false;
    while (line_no_ < lines_.size()) {
      std::string_view n = trim(lines_[line_no_]);
      if (!(starts_with(n, "schedule ") || starts_with(n, "pointwise over ") || n.find(" = reduce_") != std::string_view::npos)) break;
      next_line();
      if (starts_with(n, "schedule ")) {
        schedule_line(n, k);
        scheduled = true;
        continue;
      }
      std::string sched;
      k.stages.push_back(stage(n, ExprCtx{p, locals}, sched));
      stage_sched.push_back(sched);
      const Stage& s = k.stages.back();
      if (s.kind == StageKind::Reduction) {
        locals[s.local] = s.body->dtype;
        if (!s.local2.empty()) locals[s.local2] = s.body->dtype;
      }
    }
    if (scheduled) {
      k.schedule.stages.resize(k.stages.size());
      for (size_t j = 0; j < k.stages.size(); ++j) {
        StageSchedule& st = k.schedule.stages[j];
        if (k.schedule.fused_pointwise) st.vector = k.schedule.vector;
        stage_schedule(stage_sched[j], k.stages[j], p, st);
      }
    } else {
      for (const std::string& s : stage_sched)
        if (!s.empty()) fail("a 'schedule' line before stage schedules");
    }
    return k;
  }

  Stage stage(std::string_view l, const ExprCtx& c, std::string& sched) const {
    Stage s;
    std::string_view rest;
    if (starts_with(l, "pointwise over ")) {
      s.kind = StageKind::Pointwise;
      rest = l.substr(15);
    } else {
      s.kind = StageKind::Reduction;
      const size_t eq = l.find(" = reduce_");
      std::string_view names = l.substr(0, eq);
      rest = l.substr(eq + 10);
      const size_t sp = rest.find(' ');
      s.reduce_op = std::string(rest.substr(0, sp));
      rest = rest.substr(sp + 1);
      if (!starts_with(rest, "over ")) fail("'over' after the reduction");
      rest = rest.substr(5);
      std::vector<std::string_view> n = split_top(names, ",");
      s.local = std::string(n[0]);
      if (n.size() == 2) s.local2 = std::string(n[1]);
      else if (n.size() != 1) fail("one or two local names");
    }
    const size_t rb = closing(rest, 0);
    if (rest.empty() || rest[0] != '[' || rb == std::string_view::npos) fail("'[inner sizes]'");
    s.inner = sizes(rest.substr(0, rb + 1));
    rest = rest.substr(rb + 1);
    if (!starts_with(rest, ": ")) fail("': body'");
    rest = rest.substr(2);
    // the body ends where ` stash `, ` -> ` or ` {` starts outside brackets
    size_t end = rest.size();
    {
      int depth = 0;
      for (size_t i = 0; i < rest.size(); ++i) {
        const char ch = rest[i];
        if (ch == '(' || ch == '[') ++depth;
        else if (ch == ')' || ch == ']') --depth;
        else if (depth == 0 && (rest.substr(i, 7) == " stash " || rest.substr(i, 4) == " -> " || rest.substr(i, 2) == " {")) {
          end = i;
          break;
        }
      }
    }
    s.body = expr(rest.substr(0, end), c);
    rest = trim(rest.substr(end));
    if (starts_with(rest, "stash ")) {
      rest = rest.substr(6);
      const size_t lb = rest.find('['), e = closing(rest, lb);
      if (lb == std::string_view::npos || e == std::string_view::npos) fail("'stash bN[index]'");
      std::tie(s.stash, s.stash_index) = element(rest.substr(0, e + 1));
      rest = trim(rest.substr(e + 1));
    }
    if (starts_with(rest, "-> ")) {
      rest = rest.substr(3);
      const size_t brace = rest.find(" {");
      std::string_view outs = brace == std::string_view::npos ? rest : rest.substr(0, brace);
      std::vector<std::string_view> parts = split_top(outs, ",");
      if (parts.size() == 2) {
        if (parts[0] != "none") std::tie(s.out, s.out_index) = element(parts[0]);
        std::tie(s.out2, s.out_index) = element(parts[1]);
      } else if (parts.size() == 1) {
        std::tie(s.out, s.out_index) = element(parts[0]);
      } else {
        fail("one or two outputs after '->'");
      }
      rest = brace == std::string_view::npos ? std::string_view() : trim(rest.substr(brace));
    }
    if (!rest.empty()) {
      if (rest.front() != '{' || rest.back() != '}') fail("'{stage schedule}' at the end of the stage");
      sched = std::string(rest.substr(1, rest.size() - 2));
    }
    return s;
  }

  void schedule_line(std::string_view l, Kernel& k) const {
    Schedule& sc = k.schedule;
    const size_t colon = l.find(':');
    if (colon == std::string_view::npos) fail("'schedule TARGET: ...'");
    sc.target = std::string(trim(l.substr(9, colon - 9)));
    for (std::string_view item : split_top(trim(l.substr(colon + 1)), ",")) {
      if (item.empty()) continue;
      if (item == "fused pointwise") sc.fused_pointwise = true;
      else if (item == "parallel inner") sc.parallel_inner = true;
      else if (item == "vector") sc.vector = true;
      else if (item == "rows persist") sc.rows_persist = true;
      else if (starts_with(item, "parallel ")) {
        for (std::string_view w : split_top(item.substr(9), " ")) {
          if (starts_with(w, "collapse(")) sc.collapse = static_cast<size_t>(integer(w.substr(9, w.size() - 10)));
          else if (w == outer_var(sc.parallel_axes)->name) ++sc.parallel_axes;
          else fail(fmt::format("parallel axes x0 x1 ... in order, not '{}'", w));
        }
      } else if (starts_with(item, "work ")) sc.work = sym_expr(item.substr(5));
      else if (starts_with(item, "threshold ")) sc.work_threshold = integer(item.substr(10));
      else if (starts_with(item, "vector_width ")) {
        // "vector_width 16 (64 B)"
        const size_t lp = item.find(" ("), bsp = item.find(" B)");
        if (lp == std::string_view::npos || bsp == std::string_view::npos || bsp < lp) fail("'vector_width N (M B)'");
        sc.vector_width = static_cast<int>(integer(item.substr(13, lp - 13)));
        sc.vector_bytes = static_cast<int>(integer(item.substr(lp + 2, bsp - lp - 2)));
      } else if (starts_with(item, "threads_per_row ")) sc.threads_per_row = static_cast<int>(integer(item.substr(16)));
      else if (starts_with(item, "rows_per_block ")) sc.rows_per_block = static_cast<int>(integer(item.substr(15)));
      else if (starts_with(item, "grid ")) {
        const std::string_view f = item.substr(5);
        bool known = false;
        for (GpuForm g : {GpuForm::GridStride, GpuForm::WarpPerRow, GpuForm::BlockPerRow, GpuForm::SingleBlock})
          if (f == gpu_form_name(g)) {
            sc.gpu_form = g;
            known = true;
          }
        if (!known) fail(fmt::format("a gpu form (grid_stride, warp_per_row, block_per_row, single_block), not '{}'", f));
      } else if (starts_with(item, "block_threads ")) sc.block_threads = static_cast<int>(integer(item.substr(14)));
      else if (starts_with(item, "min_blocks ")) sc.min_blocks = static_cast<int>(integer(item.substr(11)));
      else if (starts_with(item, "persist ")) sc.persist_chunks = static_cast<int>(integer(item.substr(8)));
      else if (item == "index32") sc.index32 = true;
      else if (item == "index64") sc.index32 = false;
      else fail(fmt::format("a schedule item, not '{}'", item));
    }
  }

  void stage_schedule(std::string_view text, const Stage& s, const Program& p, StageSchedule& st) const {
    if (s.kind == StageKind::Reduction) st.reduction = ReductionStrategy::Serial;
    for (std::string_view item : split_top(text, ",")) {
      if (item.empty()) continue;
      if (item == "vector") {
        st.vector = true;
        continue;
      }
      if (starts_with(item, "blocks of ")) {
        st.block = static_cast<int>(integer(item.substr(10)));
        continue;
      }
      if (starts_with(item, "prefetch ")) {
        auto [b, idx] = element(item.substr(9));
        if (static_cast<size_t>(b) >= p.buffers.size()) fail(fmt::format("a declared buffer, not b{}", b));
        st.prefetch.push_back({b, p.buffers[static_cast<size_t>(b)].dtype, idx});
        continue;
      }
      const std::vector<std::string_view> w = split_top(item, " ");
      bool found = false;
      for (ReductionStrategy r : {ReductionStrategy::None, ReductionStrategy::Serial, ReductionStrategy::VectorMinMax, ReductionStrategy::Lanes,
                                  ReductionStrategy::Welford, ReductionStrategy::Warp, ReductionStrategy::Block})
        if (w[0] == strategy_name(r)) {
          st.reduction = r;
          found = true;
        }
      if (!found) fail(fmt::format("a stage schedule item, not '{}'", item));
      if (w.size() == 2) st.lanes = static_cast<int>(integer(w[1]));
      else if (w.size() != 1) fail(fmt::format("'strategy [lanes]', not '{}'", item));
    }
  }

  int64_t integer(std::string_view s) const {
    s = trim(s);
    int64_t v = 0;
    if (s.empty() || std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc()) fail(fmt::format("an integer, not '{}'", s));
    return v;
  }

  std::vector<std::string_view> lines_;
  size_t line_no_ = 0;
  std::string_view cur_;
};

}  // namespace

Program parse_program(std::string_view text) { return Parser(text).run(); }

}  // namespace protean::loop
