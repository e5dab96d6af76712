// protean::protean_mpi from the package: the MPI process group and the compiler collectives' transport.
// MPI's C API only (Open MPI's mpi.h would pull its C++ bindings from C++ otherwise)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <iostream>

#include <protean/mpi.h>
#include <protean/protean.h>

int main(int argc, char** argv) {
  namespace pt = protean;
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    pt::mpi::install_compiler_collectives();
    auto group = pt::mpi::process_group(pt::kCPU);
    pt::Tensor t = pt::full({4}, 2.5);
    group->all_reduce(t, pt::distributed::ReduceOp::Sum);
    std::cout << "ranks=" << group->size() << " sum=" << pt::sum(t).item<float>() * 1.0 / group->size() << "\n";
    pt::mpi::uninstall_compiler_collectives();
  }
  MPI_Finalize();
  return rc;
}
