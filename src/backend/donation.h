// Input donation for one call of a compiled graph (XLA/JAX's `donate_argnums`, PyTorch's
// `torch._dynamo` has no equivalent): the caller promises that it will not read the donated input
// tensors after the call, so a backend may write graph outputs into their memory instead of
// allocating fresh buffers. compile_train_step donates its parameter and optimizer-state arenas, so
// the update writes the new values in place and nothing is copied back.
//
// The promise is made per call on the calling thread (DonationScope around the compiled call); the
// artifact that runs the call takes it (take_donation, which clears it, so graphs nested in that call,
// cond branches and regions, never see it). A backend that does not implement donation ignores it and
// returns fresh outputs, which is always correct. The cpu backend (backend/cpu/runner.cpp) writes an
// output into a donated input only where its loop program proves it safe: same dtype and sizes, the
// output written by a pointwise kernel stage whose reads of the input are at the element it writes,
// and no step after that kernel reading the input (or any extern result computed from it).
#pragma once

#include <utility>
#include <vector>

namespace protean::backend {

/// The data pointers of the donated inputs of the next compiled call on this thread.
inline std::vector<const void*>& donation_slot() {
  thread_local std::vector<const void*> slot;
  return slot;
}

/// Donates the tensors whose data pointers are given for the compiled calls made in this scope.
class DonationScope {
 public:
  explicit DonationScope(std::vector<const void*> data_ptrs) : saved_(std::move(donation_slot())) {
    donation_slot() = std::move(data_ptrs);
  }
  ~DonationScope() { donation_slot() = std::move(saved_); }
  DonationScope(const DonationScope&) = delete;
  DonationScope& operator=(const DonationScope&) = delete;

 private:
  std::vector<const void*> saved_;
};

/// Takes this thread's donation (empty when there is none) and clears it.
inline std::vector<const void*> take_donation() {
  std::vector<const void*> d = std::move(donation_slot());
  donation_slot().clear();
  return d;
}

}  // namespace protean::backend
