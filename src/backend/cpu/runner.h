// Runner: the cpu backend's Artifact. Executes a scheduled Program's steps: generated kernels through
// function pointers from the loaded library, externs through ops::run_eager.
//
// Per run: symbol values are taken from the dispatcher (BackendInput::symbols order); symbols the
// dispatcher does not pass are read from input sizes. Non-contiguous inputs are copied contiguous.
// Memory slots (buffer planning) are allocated at the largest size of their members for this call's
// symbol values; outputs are fresh tensors, or donated inputs' memory (backend/donation.h). Thread-safe: run() keeps all state on its stack
// (the prewarm thread of the first run aside, see below).
//
// Externs: the extern ops that extern_result_is_fresh accepts have their Temp results in the slot plan
// too (schedule_program's extern_output_slot): the run offers the slot to the op's kernel as its
// output memory (ops::OutputPlacementScope), so a conv's or matmul's result is not a fresh allocation
// on every call. Their output metadata (the meta function's result) is kept for the last symbol values
// seen, so a call with the same sizes runs the kernels without their meta functions.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <span>
#include <unordered_map>
#include <vector>

#include "loop/loop_ir.h"
#include "backend/registry.h"
#include "cache/kernel_cache.h"
#include "sym/shape_env.h"

namespace protean::backend::cpu {

using KernelFn = void (*)(char* const*, const int64_t*);

/// True for extern steps whose op always returns newly made results, never a view of an input or an
/// input itself (convolutions, GEMMs, pooling, attention, upsampling, and their fused forms). Their
/// Temp results may share memory slots with other temporaries (loop::ScheduleOptions).
bool extern_result_is_fresh(const loop::Extern& e);

class CpuArtifact final : public Artifact {
 public:
  /// `given` = how many leading Program::symbols the dispatcher passes; the rest are bound from
  /// inputs. `lib` may be null when the program has no kernels.
  /// `asserts`: the capture's runtime assertions, each checked once its symbols are bound (before the
  /// first step, or after the extern that binds its last unbacked symbol); RuntimeError when one fails.
  /// `kernel_buffers`: per kernel, the buffer ids its local pointer table B[0..] holds (the dedup'd
  /// translation unit of codegen.h); empty: every kernel takes the table of all buffers.
  CpuArtifact(loop::Program p, size_t given, std::shared_ptr<const cache::Library> lib,
              std::vector<sym::RuntimeAssert> asserts = {}, std::vector<std::vector<int>> kernel_buffers = {});
  ~CpuArtifact() override;
  std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const override;
  const loop::Program& program() const { return p_; }

 private:
  loop::Program p_;
  size_t given_;
  std::shared_ptr<const cache::Library> lib_;
  std::vector<KernelFn> fns_;
  std::vector<std::vector<int>> kernel_buffers_;  // per kernel: buffers of its local table (empty: all)
  std::unordered_map<sym::Expr, size_t> sym_index_;
  std::vector<std::pair<int, int>> bind_from_input_;  // per extra symbol: (input, dim); (-1, -1) = late
  struct LateBind {
    size_t output;  // which output of the extern
    size_t dim;
    size_t symbol;  // index into Program::symbols
    bool value;     // the output's value (local_scalar_dense), not its size `dim`
  };
  std::vector<std::vector<LateBind>> late_binds_;     // per extern: unbacked sizes read from its result
  bool has_late_ = false;
  std::vector<std::vector<int>> alloc_before_;        // per step: buffers a kernel of it writes first
  std::vector<int> input_buffer_;                     // per graph input: buffer id
  // Input donation (backend/donation.h): per graph output, the inputs whose memory it may be written
  // into (same dtype and sizes, proven safe by the program's step order and indices), in input order.
  std::vector<std::vector<int>> donors_;
  struct SymAttr {
    uint32_t attr;
    int32_t element;
    sym::Expr expr;
  };
  std::vector<std::vector<SymAttr>> extern_sym_attrs_;
  std::vector<sym::RuntimeAssert> asserts_;
  std::vector<size_t> asserts_at_start_;
  std::vector<std::vector<size_t>> asserts_after_extern_;  // per extern
  void check_assert(const sym::RuntimeAssert& a, const std::function<int64_t(sym::Expr)>& lookup) const;

  // Prewarm: the first run() starts one thread that calls the program's f32 convolutions (with
  // conv2d_backward_input / _weight), in step order, under ops::DnnlPrepareOnly on stand-in tensors of
  // this call's sizes (the constants themselves for weights), so their oneDNN primitives are built and
  // their constant weights packed
  // while the run executes the steps before them; the run then finds them cached (or waits for the one
  // being built). Best effort: a job that cannot be sized or fails is skipped, and the run builds what
  // it needs itself. PROTEAN_CPU_PREWARM=0 turns it off. Joined by the destructor.
  // Slot memory kept between runs: one block holding every memory slot (64-byte aligned offsets),
  // taken by a run and given back when it ends, the largest block seen kept (a concurrent run that
  // finds it taken allocates its own). Allocating the slots afresh on each call re-faulted their pages every time the sizes
  // changed (a training step over varying sequence lengths spent a fifth of its time in page faults);
  // a kept block that is large enough serves any smaller call; a call that needs a larger one frees
  // the kept block before allocating it (never both resident). No output aliases slot memory.
  mutable std::mutex slot_mu_;
  mutable std::vector<Tensor> slot_blocks_;
  Tensor take_slot_block(int64_t bytes) const;
  void give_slot_block(Tensor block) const;

  // Output metadata of every extern for the symbol values S of the last run that computed them
  // (ops whose meta function depends only on the inputs' sizes, strides and dtypes: not views, not
  // data-dependent shapes). Same S, same metadata: the sizes of every buffer are functions of S.
  struct MetaMemo {
    std::vector<int64_t> S;
    std::vector<std::vector<TensorMeta>> metas;  // per extern; empty for externs not memoized
  };
  std::vector<bool> memo_meta_;  // per extern
  mutable std::mutex memo_mu_;
  mutable std::shared_ptr<const MetaMemo> memo_;

  std::vector<size_t> prewarm_externs_;  // extern indices: the convolutions
  mutable std::once_flag prewarm_once_;
  mutable std::thread prewarm_;
  void start_prewarm(std::span<const Tensor> inputs, const std::vector<Tensor>& constants,
                     const std::function<int64_t(sym::Expr)>& lookup) const;
};

}  // namespace protean::backend::cpu
