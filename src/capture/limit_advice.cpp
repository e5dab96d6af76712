#include "capture/limit_advice.h"

#include <fmt/format.h>

#include <regex>

namespace protean::capture {

namespace {

// The argument named `source`, or nullptr.
const detail::ArgValue* arg_named(const detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                                  const std::string& source, size_t* index) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string n = i < f.opts.arg_names.size() && !f.opts.arg_names[i].empty() ? f.opts.arg_names[i]
                                                                                  : fmt::format("args[{}]", i);
    if (n == source) {
      *index = i;
      return &args[i];
    }
  }
  return nullptr;
}

// The module holding attribute `dotted` ("blocks.3.step" → child blocks.3, "step"), or nullptr.
const Module* attribute_owner(const Module* m, const std::string& dotted, std::string& leaf) {
  std::string rest = dotted;
  while (m) {
    size_t dot = rest.find('.');
    if (dot == std::string::npos) {
      leaf = rest;
      return m;
    }
    std::string head = rest.substr(0, dot);
    const Module* next = nullptr;
    for (const auto& [n, c] : m->named_children())
      if (n == head) next = c.get();
    m = next;
    rest = rest.substr(dot + 1);
  }
  return nullptr;
}

std::string dynamic_off_note(const detail::CompiledFunctionImpl& f) {
  return f.opts.dynamic == Dynamic::Off ? " (the function is compiled with dynamic=Off, which keeps every size and "
                                          "int static: compile with dynamic=Auto to let it vary)"
                                        : "";
}

}  // namespace

std::string limit_advice(const detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                         const std::string& reason) {
  std::smatch m;
  static const std::regex int_re("int '([^']+)' mismatch");
  static const std::regex float_re("float '([^']+)' mismatch");
  static const std::regex size_re("tensor '([^']+)' size mismatch at index ([0-9]+)");
  static const std::regex guard_re(": (.*) \\((s[0-9]+) = ([^,]+?)(?:, |\\)$)");
  if (std::regex_search(reason, m, int_re)) {
    const std::string src = m[1];
    if (src.rfind("self.", 0) == 0 && f.module) {
      std::string leaf;
      const Module* owner = attribute_owner(f.module.get(), src.substr(5), leaf);
      std::string how;
      if (!f.opts.dynamic_attributes)
        how = "CompileOptions::dynamic_attributes is false: set it to true to let the attribute vary as a SymInt";
      else if (owner && owner->attribute_is_static(leaf))
        how = fmt::format("it is marked static (Module::mark_static(\"{}\")): remove the mark to let it vary as a SymInt",
                          leaf);
      else if (f.opts.dynamic == Dynamic::Off)
        how = "the function is compiled with dynamic=Off: compile with dynamic=Auto to let it vary as a SymInt";
      else
        how = fmt::format("list it in PROTEAN_DYNAMIC_SOURCES={} to make it a SymInt from the first compile", src);
      return fmt::format("\n   the Module attribute '{}' keeps changing: {}", src, how);
    }
    size_t i = 0;
    if (const detail::ArgValue* a = arg_named(f, args, src, &i)) {
      if (a->kind == detail::ArgValue::Kind::Int)
        return fmt::format("\n   '{}' is a plain int64_t argument and keeps changing: declare it protean::SymInt to let "
                           "it vary without recompiling",
                           src);
      return fmt::format("\n   the SymInt '{}' keeps changing but stays static{}; PROTEAN_DYNAMIC_SOURCES={} makes it "
                         "dynamic from the first compile",
                         src, dynamic_off_note(f), src);
    }
    return "";
  }
  if (std::regex_search(reason, m, float_re)) {
    const std::string src = m[1];
    size_t i = 0;
    const detail::ArgValue* a = arg_named(f, args, src, &i);
    if (a && a->kind == detail::ArgValue::Kind::Float)
      return fmt::format("\n   '{}' is a plain double argument and keeps changing: declare it protean::SymFloat to "
                         "let it vary without recompiling",
                         src);
    return fmt::format("\n   the SymFloat '{}' keeps changing and the graph guards its value{}: it is compared, "
                       "converted to double, or baked into an op attribute (a clamp bound...); use it only as an "
                       "arithmetic operand to let it vary",
                       src, dynamic_off_note(f));
  }
  if (std::regex_search(reason, m, size_re)) {
    const std::string src = m[1], dim = m[2];
    std::string size_src = fmt::format("{}.size()[{}]", src, dim);
    if (src.rfind("self.", 0) == 0)
      return fmt::format("\n   '{}' (a Module parameter or buffer) keeps changing: set "
                         "CompileOptions::dynamic_parameters to let it be dynamic",
                         size_src);
    return fmt::format("\n   '{}' keeps changing but stays static{} (a mark_static, or a dim marked after "
                       "its first compile): mark it dynamic at the call with `pt::mark_dynamic({}, {});` or set "
                       "PROTEAN_DYNAMIC_SOURCES={}",
                       size_src, dynamic_off_note(f), src, dim, size_src);
  }
  if (std::regex_search(reason, m, guard_re))
    return fmt::format("\n   '{}' is symbolic ({}), but a guard on it keeps failing ({}): the traced code "
                       "decides on its value (an int conversion, a C++ branch, a number of pieces); "
                       "PROTEAN_LOGS=+dynamic names the line that adds the guard",
                       std::string(m[3]), std::string(m[2]), std::string(m[1]));
  return "";
}

Device input_device(std::span<const detail::ArgValue> args) {
  for (const auto& a : args) {
    if (a.kind == detail::ArgValue::Kind::Tensor && a.tensor.defined()) return a.tensor.device();
    if (a.kind == detail::ArgValue::Kind::TensorList)
      for (const auto& t : a.tensors)
        if (t.defined()) return t.device();
  }
  return kCPU;
}

}  // namespace protean::capture
