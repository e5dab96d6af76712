// PyTorch-style printer and recursive-descent parser for SymExpr.
#include "sym/printer.h"

#include <cctype>
#include <vector>

namespace protean::sym {

namespace {

// Python operator precedence, lowest first. Calls, names and FloorDiv (self-parenthesized) are atoms.
enum Prec : int { kRel = 1, kOr = 2, kAnd = 3, kAdd = 5, kMul = 6, kNot = 7, kPow = 8, kAtom = 10 };

struct Printer {
  const SymbolNamer* namer;

  int prec(Expr e) const {
    switch (e->kind) {
      case Kind::Integer: return e->value < 0 ? kAdd : kAtom;
      case Kind::Symbol:
      case Kind::True:
      case Kind::False:
      case Kind::FloorDiv:
      case Kind::CeilDiv:
      case Kind::Mod:
      case Kind::Max:
      case Kind::Min:
      case Kind::Eq:
      case Kind::Ne:
        return kAtom;
      case Kind::Pow: return kPow;
      case Kind::Mul: return split_coefficient(e).first < 0 ? kAdd : kMul;
      case Kind::Add: return kAdd;
      case Kind::Lt:
      case Kind::Le:
      case Kind::Gt:
      case Kind::Ge:
        return kRel;
      case Kind::And: return kAnd;
      case Kind::Or: return kOr;
      case Kind::Not: return kNot;
    }
    return kAtom;
  }

  std::string at(Expr e, int context) const {
    std::string s = str(e);
    return prec(e) < context ? "(" + s + ")" : s;
  }

  std::string call(const char* name, Expr e) const {
    std::string s = std::string(name) + "(";
    for (size_t i = 0; i < e->args.size(); ++i) s += (i ? ", " : "") + str(e->args[i]);
    return s + ")";
  }

  std::string infix(Expr e, const char* op, int context) const {
    std::string s;
    for (size_t i = 0; i < e->args.size(); ++i) s += (i ? op : "") + at(e->args[i], context);
    return s;
  }

  // A product without its sign: "2*s0*s1" for Mul[-2, s0, s1] when negate is true.
  std::string product(Expr e, bool negate) const {
    auto [c, m] = split_coefficient(e);
    if (negate) c = -c;
    std::string s;
    if (c == -1)
      s = "-";
    else if (c != 1)
      s = std::to_string(c) + "*";
    if (m->kind == Kind::Mul)
      s += infix(m, "*", kMul + 1);
    else
      s += at(m, kMul + 1);
    return s;
  }

  std::string str(Expr e) const {
    switch (e->kind) {
      case Kind::Integer: return std::to_string(e->value);
      case Kind::Symbol: return namer ? (*namer)(e) : e->name;
      case Kind::True: return "True";
      case Kind::False: return "False";
      case Kind::Add: {
        std::string s;
        for (size_t i = 0; i < e->args.size(); ++i) {
          Expr t = e->args[i];
          bool negative = t->is_integer() ? t->value < 0 : split_coefficient(t).first < 0;
          if (i == 0) {
            s += t->kind == Kind::Mul ? product(t, false) : str(t);
          } else if (negative) {
            s += " - ";
            s += t->is_integer() ? std::to_string(t->value).substr(1) : product(t, true);
          } else {
            s += " + " + (t->kind == Kind::Mul ? product(t, false) : at(t, kAdd + 1));
          }
        }
        return s;
      }
      case Kind::Mul: return product(e, false);
      case Kind::Pow: return at(e->args[0], kPow + 1) + "**" + at(e->args[1], kPow + 1);
      case Kind::FloorDiv: return "(" + at(e->args[0], kAtom) + "//" + at(e->args[1], kAtom) + ")";
      case Kind::CeilDiv: return call("CeilDiv", e);
      case Kind::Mod: return call("Mod", e);
      case Kind::Max: return call("Max", e);
      case Kind::Min: return call("Min", e);
      case Kind::Eq: return call("Eq", e);
      case Kind::Ne: return call("Ne", e);
      case Kind::Lt: return at(e->args[0], kAdd) + " < " + at(e->args[1], kAdd);
      case Kind::Le: return at(e->args[0], kAdd) + " <= " + at(e->args[1], kAdd);
      case Kind::Gt: return at(e->args[0], kAdd) + " > " + at(e->args[1], kAdd);
      case Kind::Ge: return at(e->args[0], kAdd) + " >= " + at(e->args[1], kAdd);
      case Kind::And: return infix(e, " & ", kAnd + 1);
      case Kind::Or: return infix(e, " | ", kOr + 1);
      case Kind::Not: return "~" + at(e->args[0], kNot + 1);
    }
    return "?";
  }
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Expr parse_all() {
    Expr e = parse_rel();
    skip();
    if (pos_ != text_.size()) fail("unexpected trailing text");
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError("protean::sym::parse: " + what + " at column " + std::to_string(pos_ + 1) + " in '" +
                     std::string(text_) + "'");
  }
  void skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool peek(std::string_view tok) {
    skip();
    return text_.substr(pos_, tok.size()) == tok;
  }
  bool accept(std::string_view tok) {
    if (!peek(tok)) return false;
    pos_ += tok.size();
    return true;
  }
  void expect(std::string_view tok) {
    if (!accept(tok)) fail("expected '" + std::string(tok) + "'");
  }

  Expr parse_rel() {
    Expr a = parse_or();
    struct Op {
      std::string_view tok;
      Kind kind;
    };
    static constexpr Op ops[] = {{"<=", Kind::Le}, {">=", Kind::Ge}, {"==", Kind::Eq}, {"!=", Kind::Ne},
                                 {"<", Kind::Lt},  {">", Kind::Gt}};
    for (const Op& op : ops)
      if (accept(op.tok)) return relation(op.kind, a, parse_or());
    return a;
  }
  Expr parse_or() {
    Expr a = parse_and();
    while (accept("|")) a = or_(a, parse_and());
    return a;
  }
  Expr parse_and() {
    Expr a = parse_arith();
    while (accept("&")) a = and_(a, parse_arith());
    return a;
  }
  Expr parse_arith() {
    Expr a = parse_term();
    for (;;) {
      if (accept("+"))
        a = add(a, parse_term());
      else if (accept("-"))
        a = sub(a, parse_term());
      else
        return a;
    }
  }
  Expr parse_term() {
    Expr a = parse_unary();
    for (;;) {
      if (peek("**")) return a;  // handled in parse_power
      if (accept("//"))
        a = floordiv(a, parse_unary());
      else if (accept("*"))
        a = mul(a, parse_unary());
      else if (accept("%"))
        a = mod(a, parse_unary());
      else
        return a;
    }
  }
  Expr parse_unary() {
    if (accept("-")) return neg(parse_unary());
    if (accept("~")) return not_(parse_unary());
    return parse_power();
  }
  Expr parse_power() {
    Expr base = parse_atom();
    if (accept("**")) return pow(base, parse_unary());
    return base;
  }
  std::vector<Expr> parse_args() {
    std::vector<Expr> args;
    expect("(");
    if (accept(")")) return args;
    do args.push_back(parse_rel());
    while (accept(","));
    expect(")");
    return args;
  }
  Expr parse_atom() {
    skip();
    if (pos_ >= text_.size()) fail("unexpected end of text");
    char c = text_[pos_];
    if (accept("(")) {
      Expr e = parse_rel();
      expect(")");
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t start = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      try {
        return integer(std::stoll(std::string(text_.substr(start, pos_ - start))));
      } catch (const std::out_of_range&) {
        fail("integer out of int64 range");
      }
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
      std::string name(text_.substr(start, pos_ - start));
      if (name == "True") return true_();
      if (name == "False") return false_();
      if (!peek("(")) return symbol(name);
      std::vector<Expr> a = parse_args();
      auto need = [&](size_t n) {
        if (a.size() != n) fail(name + " takes " + std::to_string(n) + " arguments");
      };
      if (name == "Eq" || name == "Ne" || name == "Lt" || name == "Le" || name == "Gt" || name == "Ge") {
        need(2);
        Kind k = name == "Eq" ? Kind::Eq : name == "Ne" ? Kind::Ne : name == "Lt" ? Kind::Lt
               : name == "Le" ? Kind::Le : name == "Gt" ? Kind::Gt : Kind::Ge;
        return relation(k, a[0], a[1]);
      }
      if (name == "Mod") return need(2), mod(a[0], a[1]);
      if (name == "FloorDiv") return need(2), floordiv(a[0], a[1]);
      if (name == "CeilDiv") return need(2), ceildiv(a[0], a[1]);
      if (name == "Pow") return need(2), pow(a[0], a[1]);
      if (name == "Not") return need(1), not_(a[0]);
      if (a.empty()) fail(name + " needs arguments");
      if (name == "Max") return maximum(a);
      if (name == "Min") return minimum(a);
      if (name == "And") return and_(a);
      if (name == "Or") return or_(a);
      fail("unknown function '" + name + "'");
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

std::string print(Expr e) { return Printer{nullptr}.str(e); }
std::string print(Expr e, const SymbolNamer& namer) { return Printer{&namer}.str(e); }

Expr parse(std::string_view text) {
  try {
    return Parser(text).parse_all();
  } catch (const ParseError&) {
    throw;
  } catch (const std::exception& ex) {  // type errors and division by zero from the constructors
    throw ParseError(std::string("protean::sym::parse: ") + ex.what() + " in '" + std::string(text) + "'");
  }
}

}  // namespace protean::sym
