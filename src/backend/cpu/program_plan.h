// The cpu backend's compiled plan as bytes, for the program cache (cache/program_cache.h): what a warm
// process needs to build a CpuArtifact without lowering, scheduling or code generation.
//
// Key (plan_key): xxhash64 of a text holding the Protean version, the backend's switches
// (PROTEAN_CPU_POST_OPS / _CONV_LAYOUT / _KERNEL_DEDUP / _VECTORIZE / _FUSED_ATTENTION /
// _PACKED_WEIGHTS / _MERGE_DIMS) and the streaming stores' size (codegen.h: stream_store_min_bytes,
// which the translation unit holds), the size symbols the dispatcher
// passes, the runtime assertions, the post-pass graph's text (ir::print) and, per Constant node,
// its dtype, sizes, strides and an xxh3 of its bytes: two graphs that differ only in weights get
// different keys. Graphs with subgraphs (cond, call_region) are not cached (their branch programs are
// artifacts of their own). The compiler and its flags are not in the key: the plan holds the
// translation unit, and the library is looked up (or built) under the kernel cache's own key, so a
// plan that travels to another machine finds its kernels built for that machine.
//
// Plan bytes (encode_plan): magic "PCPUPLN1", then length-prefixed parts: the program's loop text form
// (loop::to_text, read back by loop::parse_program, which verifies it), the translation unit, whether
// it is a large program, the distinct kernel count and scheduling's counters, the per-kernel buffer tables, every extern's attributes in full (typed; the
// text form keeps only post_ops), and per Constant buffer its sizes and either the index of the
// constant of the backend's rewritten graph whose tensor it is (the backend's graph rewrites, post-op
// fusion and conv layouts, run again on a plan hit: they are cheap and make the folded weights) or
// its bytes (a constant lowering made). The text form's constant buffers are printed without sizes,
// so reading it back allocates no zero-filled copy of the weights.
// decode_plan checks everything against the graph it is used for (symbols, buffer count, constant
// dtypes and sizes, buffer ids in range, the large-program flag) and throws FormatError naming what
// does not fit: the caller reports the entry corrupt and lowers again. Never crashes for any bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "loop/loop_ir.h"
#include "loop/schedule.h"

namespace protean::backend::cpu {

struct PlanKey {
  bool cacheable = false;
  uint64_t key = 0;
  std::string text;  ///< what the key hashes (the program cache checks an entry's record of it)
};
/// The key of `in`'s plan; cacheable false (key 0) for graphs the program cache leaves out.
PlanKey plan_key(const BackendInput& in);

/// What a plan restores besides the program.
struct Plan {
  loop::Program program;
  std::string source;                            ///< the translation unit (kernel bodies deduplicated)
  std::vector<std::vector<int>> kernel_buffers;  ///< per kernel: buffer ids behind its local B[j]
  int unique_kernels = 0;
  loop::ScheduleStats schedule;                  ///< what scheduling did when the plan was made
};

/// `g`: the graph `p` was lowered from (the backend's rewritten copy): a constant buffer whose tensor
/// is one of g's Constant nodes is stored as a reference, any other as bytes.
std::string encode_plan(const loop::Program& p, const ir::Graph& g, const std::string& source,
                        const std::vector<std::vector<int>>& kernel_buffers, int unique_kernels,
                        const loop::ScheduleStats& schedule);
/// Decodes `bytes` for the graph and symbols of `in`; `g` is the backend's copy of that graph after
/// its own rewrites (post-op fusion, conv layouts), whose constants the plan refers to, as
/// encode_plan's `g` was. Throws FormatError (or the loop verifier's CompileError) when the bytes
/// are not a plan that fits.
Plan decode_plan(const std::string& bytes, const BackendInput& in, const ir::Graph& g);

}  // namespace protean::backend::cpu
