#include "ir/pipeline.h"

#include <unordered_map>

#include <fmt/format.h>

#include "ir/passes/cse.h"
#include "ir/passes/dce.h"
#include "ir/passes/partition.h"
#include "ir/passes/range_gather.h"
#include "ir/verifier.h"
#include "observe/phase_timer.h"

namespace protean::ir {

namespace {

class Steps {
 public:
  Steps(Graph& g, const PassOptions& o) : g_(g), o_(o) {}

  template <typename F>
  void step(std::string_view name, bool enabled, F&& pass) {
    if (!enabled) return;
    timer_.time(name, [&] { pass(g_); });
    after(name);
  }

  void after(std::string_view name) {
    if (o_.verify) {
      try {
        verify(g_);
      } catch (const CompileError& e) {
        throw CompileError(fmt::format("after IR step '{}': {}", name, e.what()));
      }
    }
    if (o_.on_step) o_.on_step(name, g_);
  }

  PassTimings take() const {
    PassTimings t;
    for (const observe::Phase& p : timer_.phases()) t.emplace_back(p.name, p.wall_s);
    return t;
  }

 private:
  Graph& g_;
  const PassOptions& o_;
  observe::PhaseTimer timer_;
};

bool has_subgraphs(const Graph& g) {
  for (const Node& n : g.nodes())
    if (!n.subgraphs.empty()) return true;
  return false;
}

/// The same steps on every subgraph (a cond's branches), recursively; each rewritten branch replaces
/// the node's pointer (subgraphs are immutable and may be shared).
/// A subgraph shared by several nodes (a region's body, one per use) is rewritten once and stays
/// shared, so backends still see one body.
void run_on_subgraphs(Graph& g, const PassOptions& o) {
  PassOptions sub = o;
  sub.on_step = nullptr;
  sub.verify = false;  // the parent's verification after this step covers the branches
  std::unordered_map<const Graph*, std::shared_ptr<const Graph>> done;
  for (Node& n : g.nodes())
    for (auto& branch : n.subgraphs) {
      auto& rewritten = done[branch.get()];
      if (!rewritten) {
        auto copy = std::make_shared<Graph>(*branch);
        run_passes(*copy, sub);
        rewritten = std::move(copy);
      }
      branch = rewritten;
    }
}

}  // namespace

PassTimings run_passes(Graph& g, const PassOptions& o) {
  Steps s(g, o);
  s.after("input");
  s.step("dead_code_elimination", o.dead_code_elimination, [](Graph& g) { dead_code_elimination(g); });
  s.step("constant_folding", o.constant_folding, [&](Graph& g) { constant_folding(g, o.folding); });
  s.step("range_gather_as_slice", o.range_gather_as_slice,
         [&](Graph& g) { range_gather_as_slice(g, o.runtime_asserts); });
  s.step("common_subexpression_elimination", o.common_subexpression_elimination,
         [](Graph& g) { common_subexpression_elimination(g); });
  s.step("dead_code_elimination", o.dead_code_elimination, [](Graph& g) { dead_code_elimination(g); });
  // A joint forward + backward graph (value_and_grad, compile_train_step): save vs recompute.
  if (o.partition && has_backward(g)) {
    s.step("partition", true, [&](Graph& g) { partition(g, o.partition_options); });
    s.step("dead_code_elimination", o.dead_code_elimination, [](Graph& g) { dead_code_elimination(g); });
  }
  s.step("subgraphs", has_subgraphs(g), [&](Graph& g) { run_on_subgraphs(g, o); });
  return s.take();
}

}  // namespace protean::ir
