#include "protean/version.h"

namespace protean {
const char* version() { return PROTEAN_VERSION; }
}  // namespace protean
