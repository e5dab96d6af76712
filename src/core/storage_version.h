// Version counters of storages (include/protean/tensor_version.h), kept beside the Storage objects:
// a table from storage to version, holding only storages that were written in place at least once.
// A storage's entry goes when the storage is destroyed (~Storage calls forget_storage_version), so a
// new storage at a reused address starts again at 0. Reading the version of a storage never written
// costs one atomic load while no storage has ever been bumped.
#pragma once

#include <cstdint>

#include "protean/tensor.h"

namespace protean::core {

/// The version of `s` (0 until bump_storage_version(s)).
uint64_t storage_version(const Storage* s);
/// Adds one to the version of `s` (a write of its bytes in place).
void bump_storage_version(const Storage* s);
/// Drops `s`'s entry (its destructor).
void forget_storage_version(const Storage* s);

}  // namespace protean::core
