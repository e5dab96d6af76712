// Compiler collectives: ranks of a distributed job agree on compile decisions (PyTorch's
// enable_compiler_collectives + guard collectives).
//
//  * FrameState exchange: before each compile of a frame (the first one included) every rank
//    all-gathers its FrameState entry for the frame (joined with its PGO entry), as profile JSON, and
//    every rank joins all of them. A dim whose size differs across ranks is therefore dynamic on every
//    rank from the first compile, and every rank compiles the same graph.
//  * Guard collective: on every call, after its guard check, each rank says whether it missed. When
//    any rank missed, every rank compiles (a rank whose entry hit compiles too), so the ranks keep
//    identical cache entries and never wait on each other in different places.
//  * No hangs: each exchange waits at most PROTEAN_COLLECTIVES_TIMEOUT_S seconds (default 60); a rank
//    that does not take part makes the others throw CompileError naming the frame and the missing
//    ranks. Ranks that reach different frames are reported the same way.
//
// libprotean has no MPI dependency: the transport is a CollectiveBackend installed at run time. The
// MPI one lives in the separate library protean_mpi (include/protean/mpi.h):
//     MPI_Init(&argc, &argv);
//     protean::mpi::install_compiler_collectives();   // then compile with compiler_collectives
// and libprotean has one over a directory store for jobs `protean launch` starts, without MPI
// (src/distributed/store_group.cpp):
//     protean::distributed::install_compiler_collectives(protean::distributed::init_from_env());
// Without an installed backend (a single process, no MPI) collectives are off; asking for them then
// warns once and changes nothing. Every rank must call compiled functions in the same order (SPMD).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dynamic/pgo.h"

namespace protean::dynamic {

/// Transport for compiler collectives. Implementations must be usable from one thread at a time
/// (calls are serialized by the caller).
class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// All-gather: every rank contributes `mine`; on success `out[r]` is rank r's payload. Waits at most
  /// `timeout_s`; on timeout returns false with `missing` = the ranks whose payload did not arrive.
  /// Every rank must call it the same number of times, in the same order.
  virtual bool all_gather(const std::string& mine, double timeout_s, std::vector<std::string>& out,
                          std::vector<int>& missing) = 0;
};

/// Installs (or, with nullptr, removes) the process's backend.
void set_collective_backend(std::shared_ptr<CollectiveBackend> backend);
std::shared_ptr<CollectiveBackend> collective_backend();

/// True when collectives apply: `option` (CompileOptions::compiler_collectives) or
/// PROTEAN_COMPILER_COLLECTIVES=1, and an installed backend with more than one rank. Asking for them
/// without a backend warns once.
bool collectives_active(bool option);
/// The longest deadline a collective waits (about 31 years): "inf" and larger values become this, so
/// that `now + timeout` never overflows the clock.
inline constexpr double kMaxCollectivesTimeoutS = 1e9;
/// PROTEAN_COLLECTIVES_TIMEOUT_S (seconds, default 60 when unset or empty; re-read on each call),
/// capped at kMaxCollectivesTimeoutS. Throws ValueError naming the variable and its value when it is
/// not a number greater than 0 ("abc", "5x", "0", "-1", "nan"): a deadline the user mistyped is never
/// replaced by the default in silence.
double collectives_timeout_s();

/// Guard collective: returns true when any rank missed its cache. Throws CompileError on timeout
/// (naming the frame and the missing ranks) or when another rank is at a different frame.
bool any_rank_missed(const FrameIdentity& id, bool i_missed);

/// FrameState exchange before a compile: the join of every rank's `mine`. Logs (PROTEAN_LOGS=pgo or
/// +dynamic) which dims the other ranks made dynamic. Throws CompileError like any_rank_missed.
FrameProfile exchange_frame_state(const FrameIdentity& id, const FrameProfile& mine, const std::string& compile_id);

}  // namespace protean::dynamic
