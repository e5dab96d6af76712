// Version counters of tensor memory (PyTorch's tensor version counter, torch.Tensor._version).
//
// Every storage has a version, 0 until its bytes are first written in place. Protean's own in-place
// writers bump it: optimizer steps (optim::*::step), the compiled train step's arenas, outputs written
// into donated inputs, in-place collectives (distributed::ProcessGroup::all_reduce / broadcast on the
// CPU). Data derived from a tensor's bytes and kept across calls — the cpu backend's packed matmul
// weights (docs/cpu.md "Matmul and linear") — is rebuilt when the version it was made from is no
// longer current. Views share their base's storage and so its version.
//
// A write Protean cannot see — through data_ptr(), DLPack, or memory wrapped by from_blob — must be
// announced with increment_version(t) before the next call that reads t, as with
// torch.autograd.graph.increment_version. Without it the cpu backend still compares 64 elements
// spread over a packed weight on every call and repacks (with one warning) when any differs, which
// catches new weights loaded into old memory; a change that leaves all 64 sampled elements equal is not
// seen, and the call may use weights packed from the old bytes. (PROTEAN_CPU_PACKED_WEIGHTS=0 turns
// the packing off.)
#pragma once

#include <cstdint>

#include "protean/tensor.h"

namespace protean {

/// Says that `t`'s memory was written behind Protean's back: bumps its storage's version. No effect
/// on an undefined tensor or a FakeTensor (no storage). Thread-safe.
void increment_version(const Tensor& t);

/// The version of `t`'s storage (0 for an undefined tensor, a FakeTensor, or memory never written in
/// place). Thread-safe.
uint64_t tensor_version(const Tensor& t);

}  // namespace protean
