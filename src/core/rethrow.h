// Rethrowing a Protean error with more context in its message, keeping its class.
#pragma once

#include <string>
#include <string_view>
#include <typeinfo>

#include "protean/error.h"

namespace protean::core {

/// Throws an error of `e`'s exact class (ValueError, ShapeError, TypeError, NotImplementedError,
/// FormatError, CompileError, RuntimeError or Error) with `message` instead of e.what(). An error of
/// another class derived from Error (a signal such as a graph break) is rethrown unchanged: call this
/// only from inside the handler that caught `e`.
[[noreturn]] inline void rethrow_with_message(const Error& e, const std::string& message) {
  const std::type_info& t = typeid(e);
  if (t == typeid(ValueError)) throw ValueError(message);
  if (t == typeid(ShapeError)) throw ShapeError(message);
  if (t == typeid(TypeError)) throw TypeError(message);
  if (t == typeid(NotImplementedError)) throw NotImplementedError(message);
  if (t == typeid(FormatError)) throw FormatError(message);
  if (t == typeid(CompileError)) throw CompileError(message);
  if (t == typeid(RuntimeError)) throw RuntimeError(message);
  if (t == typeid(Error)) throw Error(message);
  throw;
}

/// Rethrows `e` with " (at WHERE)" appended: an op that fails while a graph or program runs (an index
/// out of range, an allocation too large) names the node it ran for (the user's line, or the ONNX
/// node). Unchanged when `where` is empty or the message already names it. Call only from inside the
/// handler that caught `e`.
[[noreturn]] inline void rethrow_at(const Error& e, const std::string& where) {
  if (where.empty() || std::string_view(e.what()).find(where) != std::string_view::npos) throw;
  rethrow_with_message(e, std::string(e.what()) + " (at " + where + ")");
}

}  // namespace protean::core
