#include "capture/cache_entry.h"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <regex>

#include "dynamic/policy.h"

namespace protean::capture {

void CacheEntry::init_ranges() {
  if (num_slots <= 0) return;
  slot_min = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(num_slots));
  slot_max = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(num_slots));
  for (int32_t i = 0; i < num_slots; ++i) {
    slot_min[i].store(INT64_MAX, std::memory_order_relaxed);
    slot_max[i].store(INT64_MIN, std::memory_order_relaxed);
  }
}

const Tensor* resolve_input(const InputRef& r, std::span<const detail::ArgValue> args,
                            const std::vector<const Tensor*>& module_tensors) {
  switch (r.kind) {
    case InputRef::Kind::Arg:
      return &args[static_cast<size_t>(r.arg)].tensor;
    case InputRef::Kind::ListElem: {
      const auto& v = args[static_cast<size_t>(r.arg)].tensors;
      return static_cast<size_t>(r.elem) < v.size() ? &v[static_cast<size_t>(r.elem)] : nullptr;
    }
    case InputRef::Kind::ModuleTensor:
      return static_cast<size_t>(r.arg) < module_tensors.size() ? module_tensors[static_cast<size_t>(r.arg)] : nullptr;
    case InputRef::Kind::DynFloat:
      return nullptr;
  }
  return nullptr;
}

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Checks one scalar guard; `why` (when non-null) receives the failure text.
bool check_scalar(const ScalarGuard& g, std::span<const detail::ArgValue> args, int64_t* slots, std::string* why) {
  const detail::ArgValue* a = g.kind == ScalarGuard::Kind::Attr ? nullptr : &args[static_cast<size_t>(g.arg)];
  switch (g.kind) {
    case ScalarGuard::Kind::Int: {
      if (g.slot >= 0) {
        if (slots) slots[g.slot] = a->i;
        return true;
      }
      if (a->i == g.i) return true;
      if (why) *why = fmt::format("int '{}' mismatch. expected {}, actual {}", g.source, g.i, a->i);
      return false;
    }
    case ScalarGuard::Kind::Bool:
      if (a->b == (g.i != 0)) return true;
      if (why) *why = fmt::format("bool '{}' mismatch. expected {}, actual {}", g.source, g.i != 0, a->b);
      return false;
    case ScalarGuard::Kind::Float:
      if (same_bits(a->f, g.f)) return true;
      if (why) *why = fmt::format("float '{}' mismatch. expected {}, actual {}", g.source, g.f, a->f);
      return false;
    case ScalarGuard::Kind::String:
      if (a->s == g.s) return true;
      if (why) *why = fmt::format("string '{}' mismatch. expected \"{}\", actual \"{}\"", g.source, g.s, a->s);
      return false;
    case ScalarGuard::Kind::ListLen: {
      auto n = static_cast<int64_t>(a->tensors.size());
      if (n == g.i) return true;
      if (why) *why = fmt::format("list '{}' length mismatch. expected {}, actual {}", g.source, g.i, n);
      return false;
    }
    case ScalarGuard::Kind::Attr: {
      int64_t v = *g.attr;
      if (g.slot >= 0) {
        if (slots) slots[g.slot] = v;
        return true;
      }
      if (v == g.i) return true;
      if (why) *why = fmt::format("int '{}' mismatch. expected {}, actual {}", g.source, g.i, v);
      return false;
    }
  }
  return false;
}

bool check_tensor(const TensorGuard& g, const Tensor* t, int64_t* slots, std::string* why) {
  if (g.undefined) {
    if (!t || !t->defined()) return true;
    if (why) *why = fmt::format("tensor '{}' is defined ({}{}), the graph was traced with it undefined", g.source,
                                short_name(t->dtype()), to_string(t->sizes()));
    return false;
  }
  if (!t || !t->defined()) {
    if (why) *why = fmt::format("tensor '{}' is missing or undefined", g.source);
    return false;
  }
  const TensorImpl* impl = t->impl();
  if (impl->dtype != g.dtype) {
    if (why) *why = fmt::format("tensor '{}' dtype mismatch. expected {}, actual {}", g.source, short_name(g.dtype), short_name(impl->dtype));
    return false;
  }
  if (!(impl->device == g.device)) {
    if (why) *why = fmt::format("tensor '{}' device mismatch. expected {}, actual {}", g.source, g.device.str(), impl->device.str());
    return false;
  }
  if (impl->requires_grad != g.requires_grad) {
    if (why) *why = fmt::format("tensor '{}' requires_grad mismatch. expected {}, actual {}", g.source, g.requires_grad, impl->requires_grad);
    return false;
  }
  const size_t rank = g.sizes.size();
  if (impl->sizes.size() != rank) {
    if (why) *why = fmt::format("tensor '{}' rank mismatch. expected {}, actual {}", g.source, rank, impl->sizes.size());
    return false;
  }
  for (size_t d = 0; d < rank; ++d) {
    int64_t v = impl->sizes[d].hint();
    if (g.slots[d] >= 0) {
      if (slots) slots[g.slots[d]] = v;
    } else if (v != g.sizes[d]) {
      if (why) *why = fmt::format("tensor '{}' size mismatch at index {}. expected {}, actual {}", g.source, d, g.sizes[d], v);
      return false;
    }
  }
  if (g.contiguous) {
    int64_t expected = 1;
    for (size_t d = rank; d-- > 0;) {
      int64_t sz = impl->sizes[d].hint();
      int64_t st = impl->strides[d].hint();
      if (sz != 1 && st != expected) {
        if (why) *why = fmt::format("tensor '{}' stride mismatch at index {}. expected {}, actual {}", g.source, d, expected, st);
        return false;
      }
      expected *= sz;
    }
  } else if (!g.strides.empty()) {
    for (size_t d = 0; d < rank; ++d) {
      int64_t st = impl->strides[d].hint();
      if (st != g.strides[d]) {
        if (why) *why = fmt::format("tensor '{}' stride mismatch at index {}. expected {}, actual {}", g.source, d, g.strides[d], st);
        return false;
      }
    }
  }
  // A dim marked dynamic after this entry was compiled static: recompile (like PyTorch's check of
  // _dynamo_dynamic_indices).
  if (dynamic::any_marks()) {
    auto marks = dynamic::marks_of(impl);
    for (size_t d = 0; d < marks.size() && d < rank; ++d) {
      bool wants_dynamic = marks[d].kind == dynamic::MarkKind::Dynamic || marks[d].kind == dynamic::MarkKind::MaybeDynamic;
      if (wants_dynamic && g.slots[d] < 0 && g.sizes[d] > 1) {
        if (why) *why = fmt::format("tensor '{}' dim {} was marked dynamic but is static in this entry", g.source, d);
        return false;
      }
    }
  }
  return true;
}

// "Eq(s0, 33)" + " (s0 = x.size()[0])".
std::string shape_guard_text(const CacheEntry& e, int idx) {
  std::string text = e.program.guard_text(static_cast<size_t>(idx));
  std::string binds;
  static const std::regex sym_re("[su][0-9]+");
  std::vector<std::string> seen;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), sym_re); it != std::sregex_iterator(); ++it) {
    std::string name = it->str();
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
    seen.push_back(name);
    for (size_t i = 0; i < e.symbols.size(); ++i)
      if (e.symbols[i]->name == name) {
        binds += (binds.empty() ? "" : ", ") + name + " = " + e.slot_sources[static_cast<size_t>(e.symbol_slots[i])];
      }
  }
  return binds.empty() ? text : text + " (" + binds + ")";
}

}  // namespace

namespace {
bool tie_holds(const std::pair<int32_t, int32_t>& t, const std::vector<const Tensor*>& module_tensors) {
  const size_t a = static_cast<size_t>(t.first), b = static_cast<size_t>(t.second);
  return a < module_tensors.size() && b < module_tensors.size() && module_tensors[a]->impl() == module_tensors[b]->impl();
}
}  // namespace

bool CacheEntry::check(std::span<const detail::ArgValue> args, const std::vector<const Tensor*>& module_tensors,
                       int64_t* slots) const {
  for (const auto& t : module_ties)
    if (!tie_holds(t, module_tensors)) return false;
  for (const auto& g : scalars)
    if (!check_scalar(g, args, slots, nullptr)) return false;
  for (const auto& g : tensors)
    if (!check_tensor(g, resolve_input(g.ref, args, module_tensors), slots, nullptr)) return false;
  return !has_program || program.evaluate(slots);
}

std::vector<std::string> CacheEntry::all_failures(std::span<const detail::ArgValue> args,
                                                  const std::vector<const Tensor*>& module_tensors) const {
  std::vector<std::string> out;
  std::vector<int64_t> slots(static_cast<size_t>(num_slots) + 1, 0);
  bool bound_ok = true;
  std::string why;
  for (size_t i = 0; i < module_ties.size(); ++i)
    if (!tie_holds(module_ties[i], module_tensors))
      out.push_back(module_tie_texts.size() > i ? module_tie_texts[i] : std::string("module members no longer tied"));
  for (const auto& g : scalars)
    if (!check_scalar(g, args, slots.data(), &why)) {
      out.push_back(why);
      bound_ok = false;
    }
  for (const auto& g : tensors)
    if (!check_tensor(g, resolve_input(g.ref, args, module_tensors), slots.data(), &why)) {
      out.push_back(why);
      bound_ok = false;
    }
  if (bound_ok && has_program) {
    // Report every failing shape guard: evaluate each individually through first_failure on a
    // program that stops at the first; repeated runs would need per-guard programs, so report the first.
    int idx = program.first_failure(slots.data());
    if (idx >= 0) out.push_back(shape_guard_text(*this, idx));
  }
  return out;
}

std::string CacheEntry::first_failure(std::span<const detail::ArgValue> args,
                                      const std::vector<const Tensor*>& module_tensors) const {
  auto all = all_failures(args, module_tensors);
  return all.empty() ? std::string() : all.front();
}

}  // namespace protean::capture
