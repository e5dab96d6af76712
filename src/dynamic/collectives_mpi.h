// MPI transport for compiler collectives (library protean_mpi; libprotean itself does not link MPI).
// The header does not include mpi.h.
#pragma once

namespace protean::mpi {

/// Installs the MPI CollectiveBackend over a duplicate of MPI_COMM_WORLD (so Protean's messages never
/// match the program's own) and sets the trace rank. Call after MPI_Init, from every rank (it is
/// collective: MPI_Comm_dup). Throws RuntimeError when MPI is not initialized.
void install_compiler_collectives();
/// Removes the backend and frees the communicator (call before MPI_Finalize; collective).
void uninstall_compiler_collectives();

}  // namespace protean::mpi
