// Temporary: symbolic paths of SymInt before the sym engine lands. Never reached (nothing is symbolic).
#include "protean/symint.h"
#include <stdexcept>
namespace protean::detail {
[[noreturn]] static void no_sym() { throw std::logic_error("symbolic SymInt used before the sym engine exists"); }
SymInt sym_binary(SymOp, const SymInt&, const SymInt&) { no_sym(); }
SymBool sym_compare(SymCmp, const SymInt&, const SymInt&) { no_sym(); }
SymBool sym_logic(bool, const SymBool&, const SymBool&) { no_sym(); }
SymBool sym_not(const SymBool&) { no_sym(); }
bool sym_guard_bool(const SymBool&) { no_sym(); }
int64_t sym_guard_int(const SymInt&) { no_sym(); }
std::string sym_str(const sym::ExprNode*) { no_sym(); }
}  // namespace protean::detail
