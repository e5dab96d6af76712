// oneDNN plumbing shared by the conv and matmul kernels (src/ops/conv.cpp, src/ops/linear.cpp): the
// engine and per-thread stream, per-thread scratch memory, the primitive cache, post-op translation,
// and the counters of primitive creation (ops::dnnl_stats, shown by `protean run --stats-json`).
//
// Primitives are created with a user-managed scratchpad (the caller passes scratch_memory()), so a
// primitive holds no mutable memory and one cached primitive may run on several threads at once.
// Library-layout copies of inputs and outputs (reorders around blocked convolutions) also live in
// the calling thread's scratch slots, which grow to the largest request and are then reused: the
// first call pays the page faults once per thread, not once per primitive.
#pragma once

#include <dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ops/dnnl_stats.h"
#include "ops/post_ops.h"

namespace protean::ops {

/// The process's oneDNN CPU engine, created on first use (oneDNN engines may be shared by threads).
dnnl::engine& dnnl_engine();

/// This thread's in-order oneDNN stream on dnnl_engine() (streams are not shared across threads).
dnnl::stream& dnnl_stream();

/// Scratch slots of the calling thread: slot k is a 64-byte aligned block of at least `bytes`, kept
/// (and grown when needed) for the thread's lifetime. The pointer stays valid until the next call
/// for the same slot on this thread.
enum class ScratchSlot { Src, Weights, Dst, Primitive, Operand, kCount };
void* thread_scratch(ScratchSlot slot, size_t bytes);
/// A memory object over the thread's scratch slot for the primitive scratchpad `desc`.
dnnl::memory scratch_memory(const dnnl::memory::desc& desc);

/// The process's oneDNN primitives of one kind (conv, matmul, standalone epilogue), each with the
/// descriptors and reorders it runs with, keyed by everything the primitive depends on: shapes,
/// strides, parameters and the post-op structure (DnnlPostOps::key). A kernel builds its primitive on
/// the first call with a given key and finds it here on every later one.
///
/// Thread safety: get() may be called from any thread. The lock covers the lookup and the insertion
/// only, not the (slow, JIT-compiling) `make`; a thread missing a key that another thread is building
/// waits for that build (and gets its error, if it throws) instead of building it again. Entries are immutable and
/// shared (std::shared_ptr), so a returned entry stays valid after it has been evicted.
/// Eviction: when kCapacity entries are held, the whole map is cleared before the next insertion — a
/// program whose shapes keep changing rebuilds primitives instead of growing without bound.
/// Counters: a hit is recorded with note_dnnl_hit(); `make` records its own cost (note_dnnl_create).
template <class Key, class Entry, class Hash = std::hash<Key>>
class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 1024;

  /// The process's cache of this Key/Entry type, created on first use and never destroyed: kernels may
  /// run during static destruction.
  static PrimitiveCache& instance() {
    static PrimitiveCache* c = new PrimitiveCache();
    return *c;
  }

  /// The entry for `key`; on a miss, built by `make()` (returning something convertible to
  /// std::shared_ptr<const Entry>) and inserted.
  template <class Make>
  std::shared_ptr<const Entry> get(const Key& key, Make&& make) {
    std::shared_future<std::shared_ptr<const Entry>> pending;
    std::promise<std::shared_ptr<const Entry>> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        note_dnnl_hit();
        return it->second;
      }
      auto b = building_.find(key);
      if (b != building_.end()) pending = b->second;
      else building_.emplace(key, mine.get_future().share());
    }
    if (pending.valid()) {  // another thread is building it: wait for that one (rethrows its error)
      note_dnnl_hit();
      return pending.get();
    }
    std::shared_ptr<const Entry> e;
    try {
      e = std::forward<Make>(make)();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      building_.erase(key);
      mine.set_exception(std::current_exception());
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    building_.erase(key);
    if (map_.size() >= kCapacity) map_.clear();
    std::shared_ptr<const Entry> r = map_.emplace(key, std::move(e)).first->second;
    mine.set_value(r);
    return r;
  }

 private:
  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Entry>, Hash> map_;
  std::unordered_map<Key, std::shared_future<std::shared_ptr<const Entry>>, Hash> building_;  // in flight
};

/// A post-op list translated to oneDNN for one primitive.
struct DnnlPostOps {
  dnnl::post_ops ops;
  /// The binary operands in post-op order: argument id, descriptor and data (contiguous f32).
  struct Operand {
    int arg = 0;
    dnnl::memory::desc desc;
    Tensor data;
  };
  std::vector<Operand> operands;
  /// The first post-op is add of a full-size tensor and was expressed as oneDNN's `sum`: the caller
  /// fills the destination with `sum_operand` (in the destination's layout) before running.
  bool sum_first = false;
  Tensor sum_operand;
  /// Identifies everything a primitive depends on (kinds, parameters, operand dims), as bytes; part
  /// of the primitive caches' keys.
  std::string key;
};

/// Maps an operand's shape (right-aligned to the output's logical rank, padded with 1s) to the
/// primitive's destination dims; returns false when the primitive cannot take such an operand.
using OperandDimsFn = std::function<bool(const IntVec& logical, dnnl::memory::dims& dims)>;

/// Translates `ops` (operands from `in`) for a primitive whose logical output has sizes `out`.
/// `sum_first`: allow the sum form for a first full-size add (see DnnlPostOps::sum_first; full
/// means the operand's logical shape equals `out`). Returns false when some post-op or operand has
/// no oneDNN form; the caller then applies the post-ops itself (apply_post_ops).
bool build_dnnl_post_ops(const std::vector<PostOp>& ops, std::span<const Tensor> in, const IntVec& out,
                         const OperandDimsFn& dims_of, bool sum_first, DnnlPostOps& r);

/// Adds the binary operands of `p` to a primitive's execution arguments.
void add_post_op_args(const DnnlPostOps& p, std::unordered_map<int, dnnl::memory>& args);

/// Applies `ops` to the finished result `y` (of the fused call whose inputs are `in`) and returns it:
/// a contiguous f32 `y` goes through one oneDNN binary primitive computing y + 0 in place with the list
/// as its post-ops (a JIT pass over y, cached like the other primitives); other dtypes, and lists or
/// operand shapes for which oneDNN has only its reference kernel, go to apply_post_ops.
Tensor run_post_ops(const Tensor& y, const std::vector<PostOp>& ops, std::span<const Tensor> in);

}  // namespace protean::ops
