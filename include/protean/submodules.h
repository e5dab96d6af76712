// Modular compilation: different compile options per submodule (docs/regions.md, "Modular
// compilation").
//
//   auto f = pt::compile_submodules(model, {{"encoder\\..*", {.dynamic = pt::Dynamic::On}},
//                                           {"head", {.backend = "interp"}}});
//
// Each child Module whose dotted path (`encoder.3`, `head`) fully matches a pattern (ECMAScript
// regex; the first matching spec wins) gets its own frame when the parent's forward calls it through
// protean::call: its own CompileOptions, cache entries, guards, FrameState and compile ids. Where
// such a call happens inside a compiled caller:
//  * options equal to the caller's (the nearest matched ancestor's, else the root's): the child is
//    inlined into the caller's graph, as torch.compile inlines a nested compiled function; logged
//    once under PROTEAN_LOGS=regions (`submodule self.encoder.0 inlined into model: equal options`);
//  * different options: the call stays a boundary. The caller's graph ends before it (a graph break
//    with the reason `submodule boundary: self.head runs its own frame (backend interp vs cpu)`,
//    counted in Stats::graph_breaks; the caller then runs in segments, docs/breaks.md), the child's
//    frame runs on the real tensors, and the caller's next segment starts after it. Logged once.
// Under the caller's fullgraph a boundary is the CompileError of a graph break. Options compared:
// dynamic, backend, mode, fullgraph, recompile limits, keep_size_one_symbolic, dynamic_parameters,
// dynamic_attributes, async_compile, capture_scalar_outputs, compiler_collectives, region types.
#pragma once

#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "protean/compile.h"
#include "protean/module.h"

namespace protean {

/// One pattern of compile_submodules and the options of the submodules it matches. An empty
/// `options.name` or the default "fn" becomes the submodule's dotted path.
struct SubmoduleSpec {
  std::string pattern;
  CompileOptions options = {};
};

namespace detail {
/// Records the specs for the descendants of `root` (compiled with `root_opts`). Throws ValueError for
/// an empty spec list or an invalid pattern, naming it.
void register_submodules(const std::shared_ptr<Module>& root, const CompileOptions& root_opts,
                         const std::vector<SubmoduleSpec>& specs);
}  // namespace detail

/// Compiles `module->forward` with `opts` (as compile(module, opts)), and every descendant matched by
/// `specs` with its own options and frame (see the header comment). Returns the root's
/// CompiledFunction. Throws ValueError for an empty spec list or an invalid pattern.
template <typename M>
auto compile_submodules(std::shared_ptr<M> module, std::vector<SubmoduleSpec> specs, CompileOptions opts = {},
                        std::source_location loc = std::source_location::current()) {
  detail::fill_location(opts, loc);
  detail::register_submodules(std::static_pointer_cast<Module>(module), opts, specs);
  return compile(std::move(module), std::move(opts), loc);
}

}  // namespace protean
