// Protean over MPI (library protean_mpi; libprotean itself does not link MPI, and this header does not
// include mpi.h): the process group for data-parallel training and the MPI transport of the compiler
// collectives. Link protean::protean_mpi (CMake: find_package(protean) defines it when Protean was
// built with MPI). docs/distributed.md, docs/pgo.md ("Compiler collectives").
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

/// Installs the MPI transport of the compiler collectives (CompileOptions::compiler_collectives) over a
/// duplicate of MPI_COMM_WORLD (so Protean's messages never match the program's own) and sets the
/// trace rank. Call after MPI_Init, from every rank (it is collective: MPI_Comm_dup). Throws
/// RuntimeError when MPI is not initialized.
void install_compiler_collectives();
/// Removes the transport and frees the communicator (call before MPI_Finalize; collective).
void uninstall_compiler_collectives();

}  // namespace protean::mpi
