// Controls of the process-wide cache of freed host blocks (core/tensor.cpp: Storage's large blocks,
// 1 MiB and more, are kept for reuse instead of being unmapped).
#pragma once

#include <cstddef>

namespace protean::core {

/// While alive, host blocks freed on this thread go back to the system instead of into the cache.
/// For storages a caller knows will not be asked for again at their size: compile_train_step's
/// parameters and optimizer states once their values moved into the flat arenas (kept, they would
/// stay resident for the process's lifetime, since the step reuses its own blocks and never needs
/// them). Nests.
class ReturnFreedBlocksScope {
 public:
  ReturnFreedBlocksScope();
  ~ReturnFreedBlocksScope();
  ReturnFreedBlocksScope(const ReturnFreedBlocksScope&) = delete;
  ReturnFreedBlocksScope& operator=(const ReturnFreedBlocksScope&) = delete;
};

/// Bytes of freed host blocks the cache keeps now (tests).
size_t cached_host_block_bytes();
/// Bytes of host blocks given back to the system because a ReturnFreedBlocksScope was alive, since
/// the process started (tests).
size_t returned_host_block_bytes();

}  // namespace protean::core
