# Benchmark peer: libtorch (Debian's libtorch-dev 1.13, installed by `scripts/setup.sh --peers`).
# Only benchmarks that compare against PyTorch's C++ API link it; nothing in the library or the tests
# does. Debian ships no TorchConfig.cmake, so the headers and the three libraries are looked up
# directly.
#
# Sets PROTEAN_TORCH_FOUND (ON/OFF) and, when found, the INTERFACE target protean_torch_peer, and
# defines protean_torch_bench(<name> <sources...>): an executable linked with protean and libtorch,
# or a status message saying it is skipped. PROTEAN_TORCH_BENCHES lists the bench/*_bench.cpp files
# that need libtorch, so the generic benchmark glob leaves them to protean_torch_bench.
option(PROTEAN_BENCH_TORCH "Build the benchmarks that compare against libtorch when it is found" ON)
set(PROTEAN_TORCH_BENCHES train_bench.cpp cpu2_bench.cpp)
set(PROTEAN_TORCH_FOUND OFF)
if(PROTEAN_BENCH_TORCH)
  find_path(TORCH_API_INCLUDE_DIR NAMES torch/torch.h PATH_SUFFIXES torch/csrc/api/include)
  find_path(TORCH_INCLUDE_DIR NAMES ATen/ATen.h)
  find_library(TORCH_LIBRARY NAMES torch)
  find_library(TORCH_CPU_LIBRARY NAMES torch_cpu)
  find_library(C10_LIBRARY NAMES c10)
  if(TORCH_API_INCLUDE_DIR AND TORCH_INCLUDE_DIR AND TORCH_LIBRARY AND TORCH_CPU_LIBRARY AND C10_LIBRARY)
    set(PROTEAN_TORCH_FOUND ON)
    add_library(protean_torch_peer INTERFACE)
    target_include_directories(protean_torch_peer SYSTEM INTERFACE ${TORCH_API_INCLUDE_DIR} ${TORCH_INCLUDE_DIR})
    target_link_libraries(protean_torch_peer INTERFACE ${TORCH_LIBRARY} ${TORCH_CPU_LIBRARY} ${C10_LIBRARY})
    message(STATUS "libtorch peer: ${TORCH_CPU_LIBRARY}")
  else()
    message(STATUS "libtorch not found: benchmarks against libtorch (${PROTEAN_TORCH_BENCHES}) are skipped "
                   "(install it with scripts/setup.sh --peers)")
  endif()
endif()

function(protean_torch_bench name)
  if(NOT PROTEAN_TORCH_FOUND)
    message(STATUS "skipping benchmark ${name}: needs libtorch (scripts/setup.sh --peers)")
    return()
  endif()
  add_executable(${name} ${ARGN})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE protean protean_torch_peer fmt::fmt OpenMP::OpenMP_CXX)
endfunction()
