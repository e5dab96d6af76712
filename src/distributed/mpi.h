// MPI process group for data-parallel training (library protean_mpi, like the compiler collectives'
// MPI transport in dynamic/collectives_mpi.h; libprotean itself does not link MPI). The header does
// not include mpi.h.
#pragma once

#include <memory>

#include "protean/distributed.h"
#include "protean/dtype.h"

namespace protean::mpi {

/// The process group of MPI_COMM_WORLD for tensors on `device`: for the CPU an MPI group over a
/// duplicate of MPI_COMM_WORLD (its own communicator, so its messages never match the program's or the
/// compiler collectives'); for a CUDA device an NCCL group on that device, bootstrapped over the MPI
/// group (distributed::nccl_group). Collective: every rank calls it, after MPI_Init.
///  * MPI all_reduce/broadcast are nonblocking MPI calls (MPI_Iallreduce, MPI_Ibcast) polled against
///    PROTEAN_COLLECTIVES_TIMEOUT_S (default 60 s): a peer that does not take part makes the call throw
///    RuntimeError naming the collective, the tensor and the timeout instead of hanging. After such an
///    error the communicator is unusable (the pending request cannot be withdrawn): end the job.
///  * CPU tensors of every dtype (Bool as bytes; F16/BF16 only with Sum/Avg/Max/Min over a widened
///    f32 copy). Avg is MPI_SUM followed by a division by the size.
/// Throws RuntimeError when MPI is not initialized; nccl_group's errors for a CUDA device.
std::shared_ptr<distributed::ProcessGroup> process_group(Device device = kCPU);

}  // namespace protean::mpi
