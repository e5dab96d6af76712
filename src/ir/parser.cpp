#include "ir/parser.h"

#include <fmt/format.h>

#include <cctype>
#include <regex>
#include <unordered_map>

#include "ir/sym_util.h"
#include "sym/printer.h"

namespace protean::ir {

namespace {

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class Parser {
 public:
  Parser(std::string_view text, const ParseOptions& opts) : text_(text), opts_(opts) {}

  Graph run() {
    skip_blank_lines();
    Graph g = parse_graph();
    skip_blank_lines();
    skip_ws();
    if (pos_ < text_.size()) fail("end of text after 'return'");
    return g;
  }

 private:
  /// `graph name(placeholders):` then node lines up to and including `return (...)`.
  Graph parse_graph() {
    skip_ws();
    expect_word("graph");
    skip_ws();
    size_t start = pos_;
    while (pos_ < text_.size() && ident_char(text_[pos_])) ++pos_;
    g_.name = std::string(text_.substr(start, pos_ - start));
    expect('(');
    skip_ws();
    if (!peek(')')) {
      do {
        auto [name, loc] = parse_value_name();
        expect(':');
        auto [dtype, sizes] = parse_type();
        ValueId v = g_.add_placeholder(name, dtype, std::move(sizes));
        define(v, name, loc);
      } while (accept(','));
    }
    expect(')');
    expect(':');
    end_of_line();
    bool done = false;
    while (!done) {
      skip_blank_lines();
      if (pos_ >= text_.size()) fail("'return (...)'");
      skip_ws();
      if (peek_word("return")) {
        parse_return();
        done = true;
      } else {
        parse_node();
      }
    }
    return std::move(g_);
  }

  /// The `graph ...:` blocks that follow a node line (a cond's branches), each parsed as a graph of
  /// its own (own value names).
  std::vector<std::shared_ptr<const Graph>> parse_subgraphs() {
    std::vector<std::shared_ptr<const Graph>> subs;
    for (;;) {
      size_t save = pos_;
      skip_blank_lines();
      skip_ws();
      if (!peek_word("graph")) {
        pos_ = save;
        return subs;
      }
      Parser child(text_, opts_);
      child.pos_ = pos_;
      subs.push_back(std::make_shared<const Graph>(child.parse_graph()));
      pos_ = child.pos_;
    }
  }

  // ---- errors -------------------------------------------------------------------------------------
  [[noreturn]] void fail_at(size_t at, const std::string& expected) {
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < at && i < text_.size(); ++i)
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    size_t line_end = text_.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text_.size();
    std::string got;
    if (at >= text_.size())
      got = "end of text";
    else if (text_[at] == '\n')
      got = "end of line";
    else {
      size_t e = at;
      while (e < line_end && e - at < 12 && !std::isspace(static_cast<unsigned char>(text_[e]))) ++e;
      got = fmt::format("'{}'", text_.substr(at, std::max<size_t>(e - at, 1)));
    }
    size_t col = at - line_start + 1;
    throw FormatError(fmt::format("ir parse error at {}:{}: expected {}, got {}\n  {}\n  {}^", line, col, expected,
                                  got, text_.substr(line_start, line_end - line_start),
                                  std::string(col - 1, ' ')));
  }
  [[noreturn]] void fail(const std::string& expected) { fail_at(pos_, expected); }

  // ---- lexing -------------------------------------------------------------------------------------
  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  void skip_blank_lines() {
    for (;;) {
      size_t p = pos_;
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == '#')
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      if (pos_ < text_.size() && text_[pos_] == '\n') {
        ++pos_;
        continue;
      }
      if (pos_ >= text_.size()) return;
      pos_ = p;
      return;
    }
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  bool accept(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!accept(c)) fail(fmt::format("'{}'", c));
  }
  bool peek_word(std::string_view w) {
    skip_ws();
    return text_.substr(pos_, w.size()) == w &&
           (pos_ + w.size() >= text_.size() || !ident_char(text_[pos_ + w.size()]));
  }
  void expect_word(std::string_view w) {
    if (!peek_word(w)) fail(fmt::format("'{}'", w));
    pos_ += w.size();
  }
  std::string ident(const char* what) {
    skip_ws();
    size_t start = pos_;
    while (pos_ < text_.size() && ident_char(text_[pos_])) ++pos_;
    if (start == pos_) fail(what);
    return std::string(text_.substr(start, pos_ - start));
  }
  void end_of_line() {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '#')
      while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
    if (pos_ < text_.size() && text_[pos_] != '\n') fail("end of line");
    if (pos_ < text_.size()) ++pos_;
  }
  std::string quoted_string() {
    if (!accept('"')) fail("'\"'");
    std::string r;
    for (;;) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') fail("closing '\"'");
      char c = text_[pos_++];
      if (c == '"') return r;
      if (c == '\\') {
        if (pos_ >= text_.size()) fail("an escaped character");
        char e = text_[pos_++];
        r += e == 'n' ? '\n' : e;
      } else {
        r += c;
      }
    }
  }

  // ---- values -------------------------------------------------------------------------------------
  std::pair<std::string, size_t> parse_value_name() {
    skip_ws();
    size_t at = pos_;
    if (!accept('%')) fail("a value ('%name')");
    if (pos_ < text_.size() && text_[pos_] == '"') return {quoted_string(), at};
    size_t start = pos_;
    while (pos_ < text_.size() && name_char(text_[pos_])) ++pos_;
    if (start == pos_) fail("a value name after '%'");
    return {std::string(text_.substr(start, pos_ - start)), at};
  }
  void define(ValueId v, const std::string& name, size_t at) {
    if (!names_.emplace(name, v).second) fail_at(at, fmt::format("a new value name (%{} is already defined)", name));
    if (g_.value(v).name != name) {
      try {
        g_.rename_value(v, name);
      } catch (const CompileError& e) {
        fail_at(at, fmt::format("a valid value name ({})", e.what()));
      }
    }
  }
  ValueId use() {
    skip_ws();
    if (peek_word("None")) {
      pos_ += 4;
      return kNoValue;
    }
    auto [name, at] = parse_value_name();
    auto it = names_.find(name);
    if (it == names_.end()) fail_at(at, fmt::format("a defined value (%{} is not defined before this line)", name));
    return it->second;
  }

  // ---- symbolic integers --------------------------------------------------------------------------
  /// Scans a symbolic expression up to ',' ']' ')' at bracket depth 0 (or the end of the line).
  SymInt sym_int() {
    skip_ws();
    size_t start = pos_;
    int depth = 0;
    while (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '#') {
      char c = text_[pos_];
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']' || c == ',') {
        if (depth == 0) break;
        if (c != ',') --depth;
      }
      ++pos_;
    }
    std::string_view s = text_.substr(start, pos_ - start);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    if (s.empty()) fail_at(start, "an integer or size expression");
    sym::Expr e;
    try {
      e = sym::parse(s);
    } catch (const sym::ParseError& err) {
      fail_at(start, fmt::format("a size expression ({})", err.what()));
    }
    if (e->is_bool()) fail_at(start, "an integer expression, not a boolean");
    if (e->is_integer()) return SymInt(e->value);
    int64_t hint = 0;
    try {
      hint = sym::evaluate(e, [&](sym::Expr symbol) {
        auto it = opts_.hints.find(symbol->name);
        return it == opts_.hints.end() ? opts_.default_hint : it->second;
      });
    } catch (const std::exception&) {
      hint = 0;
    }
    return SymInt(e, hint);
  }
  SymIntVec sym_list() {
    expect('[');
    SymIntVec r;
    if (accept(']')) return r;
    do r.push_back(sym_int());
    while (accept(','));
    expect(']');
    return r;
  }
  std::pair<DType, SymIntVec> parse_type() {
    skip_ws();
    size_t at = pos_;
    std::string name = ident("a dtype (f32, i64, b8, ...)");
    std::optional<DType> dt = dtype_named(name);
    if (!dt) fail_at(at, "a dtype (f32, f16, bf16, f64, i64, i32, i8, u8, b8)");
    return {*dt, sym_list()};
  }
  static std::optional<DType> dtype_named(std::string_view name) {
    for (int i = 0; i < kNumDTypes; ++i)
      if (short_name(static_cast<DType>(i)) == name) return static_cast<DType>(i);
    return std::nullopt;
  }

  // ---- attributes ---------------------------------------------------------------------------------
  ops::AttrValue attr_value() {
    skip_ws();
    if (pos_ >= text_.size()) fail("an attribute value");
    char c = text_[pos_];
    if (c == '"') return quoted_string();
    if (c == '[') return sym_list();
    if (peek_word("true")) {
      pos_ += 4;
      return true;
    }
    if (peek_word("false")) {
      pos_ += 5;
      return false;
    }
    // A word that is a dtype, or a float literal; everything else is an integer expression.
    size_t start = pos_;
    size_t e = pos_;
    while (e < text_.size() && (ident_char(text_[e]) || text_[e] == '.' || text_[e] == '-' || text_[e] == '+')) {
      if ((text_[e] == '-' || text_[e] == '+') && e > start && text_[e - 1] != 'e' && text_[e - 1] != 'E') break;
      ++e;
    }
    std::string word(text_.substr(start, e - start));
    if (auto dt = dtype_named(word)) {
      pos_ = e;
      return *dt;
    }
    static const std::regex kFloat(R"([+-]?(\d+\.\d*([eE][+-]?\d+)?|\d+[eE][+-]?\d+|inf|nan))");
    if (std::regex_match(word, kFloat)) {
      size_t next = e;
      while (next < text_.size() && (text_[next] == ' ' || text_[next] == '\t')) ++next;
      if (next >= text_.size() || text_[next] == ',' || text_[next] == ')') {
        pos_ = e;
        return std::stod(word);
      }
    }
    return sym_int();
  }

  // ---- lines --------------------------------------------------------------------------------------
  core::SourceLocation comment_loc() {
    core::SourceLocation loc;
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '#') return loc;
    ++pos_;
    size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
    std::string_view s = text_.substr(start, pos_ - start);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    size_t colon = s.rfind(':');
    if (colon == std::string_view::npos || colon + 1 >= s.size()) return loc;
    std::string_view num = s.substr(colon + 1);
    for (char c : num)
      if (!std::isdigit(static_cast<unsigned char>(c))) return loc;
    loc.file = std::string(s.substr(0, colon));
    loc.line = std::stoi(std::string(num));
    return loc;
  }

  void parse_node() {
    struct Def {
      std::string name;
      size_t at;
      DType dtype;
      SymIntVec sizes;
    };
    std::vector<Def> outs;
    do {
      auto [name, at] = parse_value_name();
      expect(':');
      auto [dtype, sizes] = parse_type();
      outs.push_back({name, at, dtype, std::move(sizes)});
    } while (accept(','));
    expect('=');
    skip_ws();
    size_t op_at = pos_;
    std::string op = ident("an op name");
    expect('(');
    if (op == "constant") {
      expect(')');
      if (outs.size() != 1) fail_at(op_at, "one value defined by constant()");
      ValueId v = g_.add_constant(Tensor(), outs[0].name);
      Value& val = g_.values()[static_cast<size_t>(v)];
      val.dtype = outs[0].dtype;
      val.strides = contiguous_strides_of(outs[0].sizes);
      val.sizes = std::move(outs[0].sizes);
      define(v, outs[0].name, outs[0].at);
      g_.nodes().back().loc = comment_loc();
      end_of_line();
      return;
    }
    std::optional<ops::OpKind> kind = ops::op_from_name(op);
    if (!kind) fail_at(op_at, fmt::format("an op from ops.def or 'constant' ('{}' is not an op)", op));
    std::vector<ValueId> inputs;
    ops::Attrs attrs;
    skip_ws();
    if (!peek(')')) {
      do {
        skip_ws();
        if (peek('%') || peek_word("None")) {
          if (!attrs.empty()) fail("a named attribute (positional inputs come first)");
          inputs.push_back(use());
        } else {
          size_t at = pos_;
          std::string name = ident("an input ('%name' or None) or an attribute ('name=value')");
          if (attrs.has(name)) fail_at(at, fmt::format("a new attribute name ('{}' is repeated)", name));
          expect('=');
          attrs.set(name, attr_value());
        }
      } while (accept(','));
    }
    expect(')');
    std::vector<TensorMeta> metas;
    for (auto& d : outs) {
      TensorMeta m;
      m.dtype = d.dtype;
      m.strides = contiguous_strides_of(d.sizes);
      m.sizes = std::move(d.sizes);
      metas.push_back(std::move(m));
    }
    std::vector<ValueId> vs;
    try {
      vs = g_.add_call(*kind, std::move(inputs), std::move(attrs), metas, comment_loc());
    } catch (const CompileError& e) {
      fail_at(op_at, fmt::format("a well-formed call ({})", e.what()));
    }
    for (size_t i = 0; i < vs.size(); ++i) define(vs[i], outs[i].name, outs[i].at);
    const size_t node = g_.nodes().size() - 1;
    end_of_line();
    std::vector<std::shared_ptr<const Graph>> subs = parse_subgraphs();
    g_.nodes()[node].subgraphs = std::move(subs);
  }

  void parse_return() {
    expect_word("return");
    expect('(');
    std::vector<ValueId> outs;
    if (!peek(')')) {
      do {
        size_t at = pos_;
        ValueId v = use();
        if (v == kNoValue) fail_at(at, "a value (None cannot be returned)");
        outs.push_back(v);
      } while (accept(','));
    }
    expect(')');
    end_of_line();
    g_.set_outputs(std::move(outs));
  }

  std::string_view text_;
  const ParseOptions& opts_;
  size_t pos_ = 0;
  Graph g_;
  std::unordered_map<std::string, ValueId> names_;
};

}  // namespace

Graph parse(std::string_view text, const ParseOptions& options) { return Parser(text, options).run(); }

}  // namespace protean::ir
