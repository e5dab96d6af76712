// The `eager` backend: capture only. Once a cache entry's guards hold, the dispatcher calls the user's
// original function on the real inputs (PyTorch's "eager" backend: it measures capture and guard
// cost without any graph execution).
#include "backend/registry.h"

namespace protean::backend {

namespace {
class EagerArtifact final : public Artifact {
 public:
  bool runs_user_function() const override { return true; }
  std::vector<Tensor> run(std::span<const Tensor>, std::span<const int64_t>) const override {
    throw RuntimeError("eager artifact: the dispatcher runs the user's function directly");
  }
};
}  // namespace

std::unique_ptr<Artifact> make_eager_artifact(const BackendInput&) { return std::make_unique<EagerArtifact>(); }

}  // namespace protean::backend
