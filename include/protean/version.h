// Library version.
#pragma once

namespace protean {
/// "MAJOR.MINOR.PATCH" of the library this program is linked against (part of artifact cache keys).
const char* version();
}  // namespace protean
