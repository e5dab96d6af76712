#!/usr/bin/env bash
# Makes the prebuilt tree bench/gpu/run.sh uses on a GPU machine that lacks Protean's build
# dependencies: bench/gpu/pack.sh BUILD_DIR DEST
#   DEST/bin: protean (the CLI: bench/gpu/ppocr_run.sh, `protean launch`), protean_cuda_tests, protean_cuda_bench, protean_gpt2_bench, protean_gpt2_cpu_bench,
#   example_ddp_char_gpt and protean_launch_rank_program (bench/gpu/ddp_run.sh),
#   protean_scenario_tests (the scenario suite on backend cuda: PROTEAN_SCENARIO_BACKEND=cuda; kept with its
#   debug info, which the scenarios' source locations need) when built (the others stripped);
#   DEST/lib: libprotean.so.0, libprotean_mpi.so, libprotean_kernel_trace.so (when built) and every shared library they load except the C/C++ runtime
#   (glibc, libstdc++, libgcc_s) and the CUDA driver, which the GPU machine provides.
# Built on Debian bookworm (glibc 2.36), the tree runs on newer glibc (Ubuntu 24.04: 2.39).
set -euo pipefail
BUILD=${1:?usage: pack.sh BUILD_DIR DEST}
DEST=${2:?usage: pack.sh BUILD_DIR DEST}
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
for b in protean protean_cuda_tests protean_cuda_bench protean_gpt2_bench protean_gpt2_cpu_bench example_ddp_char_gpt protean_launch_rank_program; do
  if [ -x "$BUILD/$b" ]; then strip -o "$DEST/bin/$b" "$BUILD/$b"; fi
done
# Unstripped: the scenarios check the user's file:line and argument names, read from debug info.
if [ -x "$BUILD/protean_scenario_tests" ]; then cp "$BUILD/protean_scenario_tests" "$DEST/bin/"; fi
strip -o "$DEST/lib/libprotean.so.0" "$(readlink -f "$BUILD/libprotean.so")"
# protean_mpi: the data-parallel example links it (its MPI path; `protean launch` runs need no MPI).
if [ -f "$BUILD/libprotean_mpi.so" ]; then strip -o "$DEST/lib/libprotean_mpi.so" "$(readlink -f "$BUILD/libprotean_mpi.so")"; fi
# The in-graph kernel trace (bench/gpu/kernel_trace.cpp, where CUPTI was found) and its libcupti.
if [ -f "$BUILD/libprotean_kernel_trace.so" ]; then strip -o "$DEST/lib/libprotean_kernel_trace.so" "$BUILD/libprotean_kernel_trace.so"; fi
skip='^(linux-vdso|/lib64/ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so)'
for f in "$DEST/bin/"* "$BUILD/libprotean.so" "$DEST/lib/libprotean_kernel_trace.so"; do
  [ -f "$f" ] || continue
  ldd "$f" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]] || [[ "$name" == libprotean* ]]; then continue; fi
  cp -L "$path" "$DEST/lib/$name"
done
du -sh "$DEST"
