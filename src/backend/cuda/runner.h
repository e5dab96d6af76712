// Runs a CudaProgram (program.h) on a CUDA device: the cuda backend's Artifact.
//
// Load (once, in the constructor): the cubin goes to cuModuleLoadData; each kernel's two entry
// points are looked up (cuModuleGetFunction) and get the dynamic shared memory they ask for;
// constants are uploaded; one argument block per kernel step is built, with the kernelParams array
// pointing into it, so a launch only rewrites the block's values (buffer addresses, symbol values).
// Run (every call): symbol values bound by the dispatcher; input tensors are used in place when they
// are contiguous on the device (CPU inputs are copied up, with a perf_hints line); the outputs and the
// memory slots the temporaries share come from the device's caching allocator (steady state: no driver
// allocation); each kernel step picks its variant from the size arguments and launches with
// cuLaunchKernel (a zero-sized grid skips the launch); BLAS steps call cuBLASLt (blas.h); host steps
// run the op's eager CPU kernel on host copies. Everything is queued on the device's stream; run()
// returns without waiting for the GPU (reading an output, e.g. .cpu(), waits).
#pragma once

#include <functional>
#include <memory>

#include "backend/cuda/program.h"
#include "backend/registry.h"

namespace protean::backend::cuda {

/// The CUDA device a graph runs on: BackendInput::device's index, 0 for a graph with host inputs only.
int device_index(const BackendInput& in);

/// Builds the artifact for `program` on CUDA device `device`. Throws RuntimeError on a driver
/// failure while loading (the CUresult's name and the call), CompileError when the program needs
/// something this runtime does not bind (unbacked size symbols).
std::unique_ptr<Artifact> make_cuda_artifact(std::shared_ptr<const CudaProgram> program, const BackendInput& in,
                                             int device = 0);

/// Whether kernels on `device` that wait for the grids ahead of them (CudaKernel::
/// waits_for_prior_grids) are launched programmatically: plain launches through cuLaunchKernelEx with
/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, graph kernel nodes joined to a kernel node
/// ahead of them by a programmatic edge. Such a kernel is scheduled once every block of the kernel
/// ahead has started, so its blocks are resident when that kernel ends: the gap between back-to-back
/// kernels shrinks to the memory flush (CUDA's programmatic dependent launch). True on compute
/// capability 9.0+ with a driver that has both entry points, unless PROTEAN_CUDA_PDL=0.
bool programmatic_launch(int device);

/// The code generator's entry: graph → CudaProgram (CUDA C rendered, NVRTC-compiled, cubin cached).
/// The cuda backend calls the function installed here; src/backend/cuda's pipeline installs it at load.
using CudaCompileFn = std::function<std::shared_ptr<const CudaProgram>(const BackendInput&)>;
void set_cuda_compiler(CudaCompileFn fn);

/// The cuda backend's factory: CompileError("no CUDA driver found ...") without a driver, else the
/// installed compiler's program wrapped by make_cuda_artifact.
std::unique_ptr<Artifact> compile_cuda(const BackendInput& in);

}  // namespace protean::backend::cuda
