// The cuda backend's plan in the program cache (cache/program_cache.h): a CudaProgram (program.h) as
// bytes, so a warm process skips attention fusion, lowering, scheduling, rendering and kernel dedup,
// as the cpu backend's plan does (backend/cpu/program_plan.h). The cubin stays in the artifact cache
// under its own key (source hash, NVRTC version, arch, flags), and cuBLASLt's algorithm choices in
// their table (blas.h): with all three a warm start runs no NVRTC, no heuristic query and no lowering.
//
// Key (cuda_plan_key): xxhash64 of a text holding the Protean version and the GNU build ID of the code
// (a plan is this build's output), the architecture rendered for, the mode, every PROTEAN_CUDA_* and
// PROTEAN_LOOP_* variable set (the backend's switches), the dispatcher's size symbols, the runtime
// assertions, the symbols' upper bounds (the schedule policy sizes rows from them), the post-pass
// graph's text (ir::print) and per Constant node its dtype, sizes and strides, and for constants of
// at most kPlanHashedConstantElements elements an xxh3 of their values (the GELU recognizer and the
// causal-mask prover read such constants' values; larger constants — weights — are referenced, never
// read by the compile, and may live on the device, where hashing them would read them back). Graphs
// with subgraphs and programs with host steps are not cached.
//
// Plan bytes (encode_cuda_plan): magic "PCUDAPL3", then every field of the program except the cubin
// and NVRTC's log (size expressions as sym::print text, read back by sym::parse; enums by name or
// checked value); a constant buffer is either a reference to the graph's Constant node holding the
// very tensor (by node order) or, when lowering made it, its bytes (at most kPlanInlineConstantBytes).
// decode_cuda_plan checks every index, count, enum and constant against the graph it is used for and
// throws FormatError naming what does not fit: the caller reports the entry corrupt and renders
// again. Never crashes for any bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/cuda/program.h"
#include "backend/registry.h"

namespace protean::backend::cuda {

inline constexpr int64_t kPlanHashedConstantElements = 4096;
inline constexpr int64_t kPlanInlineConstantBytes = int64_t{1} << 20;

struct CudaPlanKey {
  bool cacheable = false;
  uint64_t key = 0;
  std::string text;  ///< what the key hashes (the program cache checks an entry's record of it)
};
/// The key of `in`'s plan rendered for `arch`; cacheable false for graphs the cache leaves out (with
/// subgraphs, or a constant that is fake or undefined).
CudaPlanKey cuda_plan_key(const BackendInput& in, const std::string& arch);

/// `p`'s plan bytes, constants referenced into `g` (the graph `p` was compiled from: BackendInput's),
/// or std::nullopt when the program is not cacheable (host steps, a constant neither in `g` nor small).
std::optional<std::string> encode_cuda_plan(const CudaProgram& p, const ir::Graph& g);
/// The program of `bytes` for `in` (its graph's constants, its symbols). Throws FormatError when the
/// bytes are not a plan that fits.
CudaProgram decode_cuda_plan(const std::string& bytes, const BackendInput& in);

}  // namespace protean::backend::cuda
