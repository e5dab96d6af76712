// Symbolic SymFloat arithmetic and comparisons (capture/symfloat.h, include/protean/symint.h).
#include "capture/symfloat.h"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <ostream>
#include <stdexcept>

#include "protean/error.h"
#include "protean/ops.h"

namespace protean {

namespace capture {
namespace {
thread_local FloatOwner* t_owner = nullptr;
thread_local int t_literal_depth = 0;

struct LiteralScope {
  LiteralScope() { ++t_literal_depth; }
  ~LiteralScope() { --t_literal_depth; }
};

std::atomic<uint64_t> g_next_owner_id{1};

// Every node ever made, so that none is unreachable (leak checkers) and none is freed while a SymFloat
// may still point at it: immortal, like SymInt's nodes (one small node per traced float operation;
// its graph value is released when its capture ends).
std::mutex g_nodes_mu;
std::deque<detail::SymFloatNode>& all_nodes() {
  static auto* nodes = new std::deque<detail::SymFloatNode>();
  return *nodes;
}

const detail::SymFloatNode* new_node(Tensor value, uint64_t float_args, std::vector<SymInt> ints) {
  if (!t_owner) throw RuntimeError("SymFloat: symbolic arithmetic outside a running capture");
  detail::SymFloatNode* n;
  {
    std::lock_guard<std::mutex> g(g_nodes_mu);
    n = &all_nodes().emplace_back(
        detail::SymFloatNode{t_owner->float_owner_id(), std::move(value), float_args, std::move(ints)});
  }
  t_owner->adopt_float_node(n);
  return n;
}

// The node of a symbolic SymFloat, checked to belong to the running capture.
const detail::SymFloatNode& node_of(const SymFloat& f, const char* what) {
  const detail::SymFloatNode* n = f.node();
  if (!t_owner || n->owner != t_owner->float_owner_id())
    throw RuntimeError(fmt::format("SymFloat {}: the symbolic value (traced as {}) belongs to a capture that is not "
                                   "running; symbolic SymFloats exist only inside the compiled function that "
                                   "received them. Use hint() for the traced value.",
                                   what, f.hint()));
  return *n;
}

// The 0-dim f64 tensor of an operand: the graph value, or a constant for a plain value.
Tensor as_tensor(const SymFloat& f, const char* what) {
  if (f.is_symbolic()) return node_of(f, what).value;
  LiteralScope literal;
  return full({}, f.hint(), DType::F64);
}

void specialize(const SymFloat& f, const char* what) {
  if (!f.is_symbolic()) return;
  const detail::SymFloatNode& n = node_of(f, what);
  if (n.float_args) t_owner->specialize_floats(n.float_args);
  for (const SymInt& s : n.ints) (void)s.guard_int();
}
}  // namespace

FloatOwner::FloatOwner() : id_(g_next_owner_id.fetch_add(1, std::memory_order_relaxed)) {}

FloatOwner::~FloatOwner() {
  // The capture's graph is gone: drop the values that point into it. The node stays (a copy of the
  // SymFloat may live on) and node_of() refuses it, since no later capture has this id.
  std::lock_guard<std::mutex> g(g_nodes_mu);
  for (detail::SymFloatNode* n : nodes_) {
    n->value = Tensor();
    n->ints.clear();
    n->ints.shrink_to_fit();
  }
}

FloatOwnerScope::FloatOwnerScope(FloatOwner* owner) : previous_(t_owner) { t_owner = owner; }
FloatOwnerScope::~FloatOwnerScope() { t_owner = previous_; }

bool in_symfloat_literal() { return t_literal_depth > 0; }

SymFloat symbolic_float_arg(const Tensor& value, double hint, int32_t arg) {
  const uint64_t bit = uint64_t{1} << (arg < 63 ? arg : 63);
  return SymFloat(new_node(value, bit, {}), hint);
}

}  // namespace capture

namespace detail {

SymFloat symfloat_binary(FloatOp op, const SymFloat& a, const SymFloat& b) {
  const char* what = "arithmetic";
  Tensor x = capture::as_tensor(a, what), y = capture::as_tensor(b, what);
  Tensor r;
  switch (op) {
    case FloatOp::Add: r = add(x, y); break;
    case FloatOp::Sub: r = sub(x, y); break;
    case FloatOp::Mul: r = mul(x, y); break;
    case FloatOp::Div: r = div(x, y); break;
  }
  uint64_t args = 0;
  std::vector<SymInt> ints;
  for (const SymFloat* f : {&a, &b})
    if (f->is_symbolic()) {
      args |= f->node()->float_args;
      ints.insert(ints.end(), f->node()->ints.begin(), f->node()->ints.end());
    }
  return SymFloat(capture::new_node(std::move(r), args, std::move(ints)), float_op(op, a.hint(), b.hint()));
}

bool symfloat_compare(FloatCmp op, const SymFloat& a, const SymFloat& b) {
  capture::specialize(a, "comparison");
  capture::specialize(b, "comparison");
  return float_cmp(op, a.hint(), b.hint());
}

}  // namespace detail

SymFloat::SymFloat(const SymInt& n) : v_(static_cast<double>(n.hint())) {
  if (!n.is_symbolic()) return;
  if (!capture::t_owner)
    throw RuntimeError(fmt::format("SymFloat(SymInt): the symbolic value {} exists only while a compiled function is "
                                   "traced; use hint() for its traced value",
                                   n.str()));
  // n as an f64 graph value: the one element of arange(n, n + 1).
  Tensor t = reshape(arange(n, n + 1, 1, DType::F64), {});
  node_ = capture::new_node(std::move(t), 0, {n});
}

double SymFloat::guard_float() const {
  capture::specialize(*this, "conversion to double");
  return v_;
}

std::string SymFloat::str() const {
  std::string v = fmt::format("{}", v_);
  return is_symbolic() ? "SymFloat(" + v + ", symbolic)" : v;
}

std::ostream& operator<<(std::ostream& os, const SymFloat& f) { return os << f.str(); }

Tensor scalar_operand(const SymFloat& v, const Tensor& like) {
  const DType dt = is_floating(like.dtype()) ? like.dtype() : DType::F32;
  if (!v.is_symbolic()) return full({}, v.hint(), dt);
  Tensor t = capture::as_tensor(v, "operand");
  return dt == DType::F64 ? t : t.to(dt);
}

}  // namespace protean
