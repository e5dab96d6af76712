// Registry glue for the `interp` backend: wraps the Graph IR interpreter (backend/interp) as an
// Artifact.
#include "backend/donation.h"
#include "backend/interp/interp.h"
#include "backend/registry.h"

namespace protean::backend {

namespace {
class InterpArtifact final : public Artifact {
 public:
  explicit InterpArtifact(const BackendInput& in) : interp_(in.graph, in.symbols, in.runtime_asserts) {}
  std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const override {
    // Taken before anything runs, so cond branches and regions inside this call never see it.
    const std::vector<const void*> donated = take_donation();
    return interp_.run(inputs, symbol_values, donated);
  }

 private:
  Interpreter interp_;
};
}  // namespace

std::unique_ptr<Artifact> make_interp_artifact(const BackendInput& in) { return std::make_unique<InterpArtifact>(in); }

}  // namespace protean::backend
