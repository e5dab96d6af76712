#include <ostream>

#include "protean/symint.h"

namespace protean {

std::string SymInt::str() const { return is_symbolic() ? detail::sym_str(expr()) : std::to_string(hint()); }
std::string SymBool::str() const { return is_symbolic() ? detail::sym_str(expr()) : (hint() ? "True" : "False"); }
std::ostream& operator<<(std::ostream& os, const SymInt& s) { return os << s.str(); }
std::ostream& operator<<(std::ostream& os, const SymBool& s) { return os << s.str(); }
std::string to_string(const SymIntVec& v) {
  std::string r = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) r += ", ";
    r += v[i].str();
  }
  return r + "]";
}

}  // namespace protean
