// Compiler and interpreter of guard programs (see guard_eval.h).
#include "sym/guard_eval.h"

#include <cstring>
#include <functional>
#include <stdexcept>

#include "protean/error.h"
#include "sym/printer.h"

namespace protean::sym {

namespace {

int64_t wrap_add(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
int64_t wrap_sub(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
int64_t wrap_mul(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }
// floor(a / b) for b != 0 without trapping on INT64_MIN / -1.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return wrap_sub(0, a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

const char* op_name(GuardProgram::Op op) {
  using Op = GuardProgram::Op;
  switch (op) {
    case Op::Load: return "load";
    case Op::Add: return "add";
    case Op::Sub: return "sub";
    case Op::Mul: return "mul";
    case Op::FloorDiv: return "floordiv";
    case Op::CeilDiv: return "ceildiv";
    case Op::Mod: return "mod";
    case Op::Max: return "max";
    case Op::Min: return "min";
    case Op::Pow: return "pow";
    case Op::Eq: return "eq";
    case Op::Ne: return "ne";
    case Op::Lt: return "lt";
    case Op::Le: return "le";
    case Op::And: return "and";
    case Op::Or: return "or";
    case Op::Not: return "not";
    case Op::Check: return "check";
    case Op::CheckEq: return "check_eq";
    case Op::CheckNe: return "check_ne";
    case Op::CheckLt: return "check_lt";
    case Op::CheckLe: return "check_le";
  }
  return "?";
}

}  // namespace

int GuardProgram::run(const int64_t* slots) const {
  using Op = GuardProgram::Op;
  int64_t r[kMaxRegisters];
  if (!constants_.empty()) std::memcpy(r, constants_.data(), constants_.size() * sizeof(int64_t));
  for (const Insn& i : code_) {
    switch (i.op) {
      case Op::Load: r[i.dst] = slots[i.a]; break;
      case Op::Add: r[i.dst] = wrap_add(r[i.a], r[i.b]); break;
      case Op::Sub: r[i.dst] = wrap_sub(r[i.a], r[i.b]); break;
      case Op::Mul: r[i.dst] = wrap_mul(r[i.a], r[i.b]); break;
      case Op::FloorDiv:
        if (r[i.b] == 0) return i.guard;
        r[i.dst] = floor_div(r[i.a], r[i.b]);
        break;
      case Op::CeilDiv:
        if (r[i.b] == 0) return i.guard;
        r[i.dst] = wrap_sub(0, floor_div(wrap_sub(0, r[i.a]), r[i.b]));
        break;
      case Op::Mod:
        if (r[i.b] == 0) return i.guard;
        r[i.dst] = wrap_sub(r[i.a], wrap_mul(floor_div(r[i.a], r[i.b]), r[i.b]));
        break;
      case Op::Max: r[i.dst] = r[i.a] > r[i.b] ? r[i.a] : r[i.b]; break;
      case Op::Min: r[i.dst] = r[i.a] < r[i.b] ? r[i.a] : r[i.b]; break;
      case Op::Pow: {
        int64_t base = r[i.a], e = r[i.b], acc = 1;
        if (e < 0) return i.guard;
        while (e > 0) {
          if (e & 1) acc = wrap_mul(acc, base);
          base = wrap_mul(base, base);
          e >>= 1;
        }
        r[i.dst] = acc;
        break;
      }
      case Op::Eq: r[i.dst] = r[i.a] == r[i.b]; break;
      case Op::Ne: r[i.dst] = r[i.a] != r[i.b]; break;
      case Op::Lt: r[i.dst] = r[i.a] < r[i.b]; break;
      case Op::Le: r[i.dst] = r[i.a] <= r[i.b]; break;
      case Op::And: r[i.dst] = r[i.a] && r[i.b]; break;
      case Op::Or: r[i.dst] = r[i.a] || r[i.b]; break;
      case Op::Not: r[i.dst] = !r[i.a]; break;
      case Op::Check:
        if (!r[i.a]) return i.guard;
        break;
      case Op::CheckEq:
        if (r[i.a] != r[i.b]) return i.guard;
        break;
      case Op::CheckNe:
        if (r[i.a] == r[i.b]) return i.guard;
        break;
      case Op::CheckLt:
        if (!(r[i.a] < r[i.b])) return i.guard;
        break;
      case Op::CheckLe:
        if (!(r[i.a] <= r[i.b])) return i.guard;
        break;
    }
  }
  return -1;
}

std::string GuardProgram::explain(const int64_t* slots, bool with_sources) const {
  int g = run(slots);
  if (g < 0) return {};
  return with_sources ? source_texts_[g] : texts_[g];
}

std::string GuardProgram::dump() const {
  std::string s;
  for (size_t k = 0; k < constants_.size(); ++k) s += "r" + std::to_string(k) + " = " + std::to_string(constants_[k]) + "\n";
  for (const Insn& i : code_) {
    std::string line = op_name(i.op);
    switch (i.op) {
      case Op::Load: line = "r" + std::to_string(i.dst) + " = load slot[" + std::to_string(i.a) + "]"; break;
      case Op::Not: line = "r" + std::to_string(i.dst) + " = not r" + std::to_string(i.a); break;
      case Op::Check: line += " r" + std::to_string(i.a); break;
      case Op::CheckEq:
      case Op::CheckNe:
      case Op::CheckLt:
      case Op::CheckLe:
        line += " r" + std::to_string(i.a) + ", r" + std::to_string(i.b);
        break;
      case Op::Add: case Op::Sub: case Op::Mul: case Op::FloorDiv: case Op::CeilDiv: case Op::Mod:
      case Op::Max: case Op::Min: case Op::Pow: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le:
      case Op::And: case Op::Or:
        line = "r" + std::to_string(i.dst) + " = " + line + " r" + std::to_string(i.a) + ", r" + std::to_string(i.b);
        break;
    }
    s += line + "    ; guard " + std::to_string(i.guard) + ": " + texts_[static_cast<size_t>(i.guard)] + "\n";
  }
  return s;
}

void GuardProgramBuilder::bind(Expr symbol, int32_t slot) {
  if (!symbol->is_symbol()) throw std::invalid_argument("GuardProgramBuilder::bind needs a symbol, got " + print(symbol));
  slots_[symbol] = slot;
}

void GuardProgramBuilder::add_check(Expr cond, std::string text, std::string source_text) {
  if (!cond->is_bool()) throw std::invalid_argument("GuardProgramBuilder::add_check needs a boolean, got " + print(cond));
  if (text.empty()) text = print(cond);
  if (source_text.empty()) source_text = text;
  entries_.push_back({cond, -1, std::move(text), std::move(source_text)});
}

void GuardProgramBuilder::add_slot_equals(int32_t slot, Expr value, std::string text, std::string source_text) {
  if (source_text.empty()) source_text = text;
  entries_.push_back({value, slot, std::move(text), std::move(source_text)});
}

struct GuardCompiler {
  using Op = GuardProgram::Op;
  GuardProgram& p;
  const std::unordered_map<Expr, int32_t>& slots;
  std::unordered_map<Expr, int32_t> regs;         // CSE: node -> register
  std::unordered_map<int32_t, int32_t> slot_regs;  // slot -> register
  std::vector<std::pair<int64_t, int32_t>> consts;
  int32_t next = 0;
  int32_t guard = 0;
  std::string text;

  int32_t fresh() { return next++; }
  void emit(Op op, int32_t dst, int32_t a, int32_t b) { p.code_.push_back({op, dst, a, b, guard}); }

  int32_t load_slot(int32_t slot) {
    auto it = slot_regs.find(slot);
    if (it != slot_regs.end()) return it->second;
    int32_t r = fresh();
    emit(Op::Load, r, slot, 0);
    slot_regs.emplace(slot, r);
    return r;
  }

  int32_t chain(Op op, Expr e) {
    int32_t acc = value(e->args[0]);
    for (size_t k = 1; k < e->args.size(); ++k) {
      int32_t r = fresh();
      emit(op, r, acc, value(e->args[k]));
      acc = r;
    }
    return acc;
  }

  int32_t value(Expr e) {
    if (auto it = regs.find(e); it != regs.end()) return it->second;
    int32_t r = -1;
    auto binary = [&](Op op, Expr a, Expr b) {
      int32_t x = value(a), y = value(b);
      int32_t d = fresh();
      emit(op, d, x, y);
      return d;
    };
    switch (e->kind) {
      case Kind::Integer:
      case Kind::True:
      case Kind::False: {
        // Constants live in the leading registers; they are renumbered after compilation.
        r = fresh();
        consts.emplace_back(e->is_integer() ? e->value : (e->kind == Kind::True ? 1 : 0), r);
        break;
      }
      case Kind::Symbol: {
        auto it = slots.find(e);
        if (it == slots.end())
          throw std::logic_error("guard program: symbol " + e->name + " used by guard '" + text +
                                 "' has no bound source slot");
        r = load_slot(it->second);
        break;
      }
      case Kind::Add: r = chain(Op::Add, e); break;
      case Kind::Mul: r = chain(Op::Mul, e); break;
      case Kind::Max: r = chain(Op::Max, e); break;
      case Kind::Min: r = chain(Op::Min, e); break;
      case Kind::And: r = chain(Op::And, e); break;
      case Kind::Or: r = chain(Op::Or, e); break;
      case Kind::Pow: r = binary(Op::Pow, e->args[0], e->args[1]); break;
      case Kind::FloorDiv: r = binary(Op::FloorDiv, e->args[0], e->args[1]); break;
      case Kind::CeilDiv: r = binary(Op::CeilDiv, e->args[0], e->args[1]); break;
      case Kind::Mod: r = binary(Op::Mod, e->args[0], e->args[1]); break;
      case Kind::Eq: r = binary(Op::Eq, e->args[0], e->args[1]); break;
      case Kind::Ne: r = binary(Op::Ne, e->args[0], e->args[1]); break;
      case Kind::Lt: r = binary(Op::Lt, e->args[0], e->args[1]); break;
      case Kind::Le: r = binary(Op::Le, e->args[0], e->args[1]); break;
      case Kind::Gt: r = binary(Op::Lt, e->args[1], e->args[0]); break;
      case Kind::Ge: r = binary(Op::Le, e->args[1], e->args[0]); break;
      case Kind::Not: {
        int32_t x = value(e->args[0]);
        r = fresh();
        emit(Op::Not, r, x, 0);
        break;
      }
    }
    regs.emplace(e, r);
    return r;
  }

  void check(Expr cond) {
    switch (cond->kind) {
      case Kind::And:
        for (Expr a : cond->args) check(a);
        return;
      case Kind::Eq: emit(Op::CheckEq, 0, value(cond->args[0]), value(cond->args[1])); return;
      case Kind::Ne: emit(Op::CheckNe, 0, value(cond->args[0]), value(cond->args[1])); return;
      case Kind::Lt: emit(Op::CheckLt, 0, value(cond->args[0]), value(cond->args[1])); return;
      case Kind::Le: emit(Op::CheckLe, 0, value(cond->args[0]), value(cond->args[1])); return;
      case Kind::Gt: emit(Op::CheckLt, 0, value(cond->args[1]), value(cond->args[0])); return;
      case Kind::Ge: emit(Op::CheckLe, 0, value(cond->args[1]), value(cond->args[0])); return;
      case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
      case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
      case Kind::True: case Kind::False: case Kind::Or: case Kind::Not:
        emit(Op::Check, 0, value(cond), 0);  // any other condition: its value, checked non-zero
        return;
    }
  }
};

GuardProgram GuardProgramBuilder::build() const {
  GuardProgram p;
  GuardCompiler c{p, slots_, {}, {}, {}, 0, 0, {}};
  for (size_t g = 0; g < entries_.size(); ++g) {
    const Entry& e = entries_[g];
    c.guard = static_cast<int32_t>(g);
    c.text = e.text;
    p.texts_.push_back(e.text);
    p.source_texts_.push_back(e.source_text);
    if (e.slot < 0)
      c.check(e.expr);
    else
      c.emit(GuardProgram::Op::CheckEq, 0, c.load_slot(e.slot), c.value(e.expr));
  }
  if (static_cast<size_t>(c.next) > GuardProgram::kMaxRegisters)
    throw CompileError("guard program: the guards of this capture need " + std::to_string(c.next) +
                       " registers, more than " + std::to_string(GuardProgram::kMaxRegisters) +
                       " (too many distinct size expressions: mark fewer inputs dynamic, or split the function)");
  // Renumber so that constants occupy registers [0, n): one memcpy initializes them.
  std::vector<int32_t> remap(static_cast<size_t>(c.next), -1);
  int32_t k = 0;
  for (auto& [v, r] : c.consts) {
    remap[static_cast<size_t>(r)] = k++;
    p.constants_.push_back(v);
  }
  for (int32_t r = 0; r < c.next; ++r)
    if (remap[static_cast<size_t>(r)] < 0) remap[static_cast<size_t>(r)] = k++;
  auto m = [&](int32_t r) { return remap[static_cast<size_t>(r)]; };
  for (GuardProgram::Insn& i : p.code_) {
    using Op = GuardProgram::Op;
    bool is_check = i.op == Op::Check || i.op == Op::CheckEq || i.op == Op::CheckNe || i.op == Op::CheckLt || i.op == Op::CheckLe;
    if (i.op == Op::Load) {
      i.dst = m(i.dst);
    } else if (i.op == Op::Not || i.op == Op::Check) {
      if (!is_check) i.dst = m(i.dst);
      i.a = m(i.a);
    } else {
      if (!is_check) i.dst = m(i.dst);
      i.a = m(i.a);
      i.b = m(i.b);
    }
  }
  p.num_registers_ = static_cast<size_t>(c.next);
  return p;
}

GuardProgram compile_guards(const GuardSet& gs, const std::vector<SourceSlot>& bindings) {
  std::unordered_map<std::string, int32_t> slot_of;
  for (const SourceSlot& b : bindings) slot_of.emplace(b.source, b.slot);
  GuardProgramBuilder builder;
  std::unordered_map<Expr, std::string> primary;  // symbol -> source providing its value
  struct Dup {
    int32_t slot;
    Expr symbol;
    std::string text;
  };
  std::vector<Dup> dups;
  for (const GuardSet::Bound& b : gs.symbols) {
    for (const std::string& src : b.sources) {
      auto it = slot_of.find(src);
      if (it == slot_of.end()) continue;
      if (!primary.count(b.symbol)) {
        primary[b.symbol] = src;
        builder.bind(b.symbol, it->second);
      } else {
        dups.push_back({it->second, b.symbol, src + " == " + primary[b.symbol]});
      }
    }
  }
  SymbolNamer namer = [&](Expr s) {
    auto it = primary.find(s);
    return it == primary.end() ? s->name : it->second;
  };
  for (const GuardSet::Static& s : gs.statics) {
    auto it = slot_of.find(s.source);
    if (it == slot_of.end()) continue;
    std::string t = s.source + " == " + std::to_string(s.value);
    builder.add_slot_equals(it->second, integer(s.value), t, t);
  }
  for (const Dup& d : dups) builder.add_slot_equals(d.slot, d.symbol, d.text, d.text);
  for (const GuardSet::Replaced& r : gs.replaced) {
    for (const std::string& src : r.sources) {
      auto it = slot_of.find(src);
      if (it == slot_of.end()) continue;
      builder.add_slot_equals(it->second, r.value, "Eq(" + r.symbol->name + ", " + print(r.value) + ")",
                              "Eq(" + src + ", " + print(r.value, namer) + ")");
    }
  }
  for (const GuardSet::Check& c : gs.checks) builder.add_check(c.expr, c.text, print(c.expr, namer));
  return builder.build();
}

}  // namespace protean::sym
