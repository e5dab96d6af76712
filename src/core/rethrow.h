// Rethrowing a Protean error with more context in its message, keeping its class.
#pragma once

#include <string>
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

}  // namespace protean::core
