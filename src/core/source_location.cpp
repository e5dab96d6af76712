#include "core/source_location.h"

namespace protean::core {

std::string SourceLocation::str() const {
  std::string at;
  if (known())
    at = (file.empty() ? std::string("?") : file) + ":" + std::to_string(line);
  else if (backward)
    return "[bwd]";
  else
    return file.empty() ? "?" : file;
  if (function == "[optim]") return "[optim at " + at + "]";  // ir/provenance.h: kOptimizerMarker
  return backward ? "[bwd of " + at + "]" : at;
}

std::string SourceLocation::describe() const {
  if (empty()) return "";
  if (line == 0) return file.empty() ? function : function.empty() ? file : file + " in " + function;
  std::string s = file + ":" + std::to_string(line);
  if (!function.empty()) s += " in " + function;
  return s;
}

}  // namespace protean::core
