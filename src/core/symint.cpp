#include <fmt/format.h>

#include <ostream>

#include "protean/error.h"
#include "protean/symint.h"

namespace protean {

namespace detail {
void sym_division_error(const char* op, int64_t a, int64_t b) {
  if (b == 0) throw ValueError(fmt::format("SymInt: {} {} 0 divides by zero", a, op));
  throw ValueError(fmt::format("SymInt: {} {} {} overflows int64 (the quotient 2^63 does not fit); "
                               "check the operands before dividing",
                               a, op, b));
}
}  // namespace detail

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
