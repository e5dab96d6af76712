// Dimension policy: decides, per input dimension (or scalar), whether a capture treats it as static,
// dynamic (own symbol), duck-sized or unbacked. Priority, highest first:
//   1. PROTEAN_DYNAMIC_SOURCES allowlist ("x,self.cache.*": exact source names or regexes; a tensor
//      source name covers all its dims, "x.size()[0]" one dim) → Dynamic
//   2. marks: mark_dynamic (strict Dynamic, optional min/max) / maybe_mark_dynamic (Dynamic) /
//      mark_static (Static) / mark_unbacked (Unbacked)
//   3. PGO profile (dims dynamic in the frame's stored profile entry; why "pgo"), then the FrameState
//      joined across ranks by compiler collectives (why "collectives"); docs/pgo.md
//   4. FrameState automatic dynamic (a size that changed between compiles) → Dynamic
//   5. dynamic=On → Duck (dims with equal sizes share a symbol); dynamic=Off → Static
//   6. default → Static
// Module parameters/buffers are Static unless CompileOptions::dynamic_parameters (then 1–5 apply).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "protean/compile.h"
#include "protean/tensor.h"
#include "sym/shape_env.h"

namespace protean::dynamic {

class FrameState;
struct FrameProfile;

enum class MarkKind : uint8_t { None, Dynamic, MaybeDynamic, Static, Unbacked };
struct DimMark {
  MarkKind kind = MarkKind::None;
  std::optional<int64_t> min, max;
};

/// Marks recorded on a tensor (by TensorImpl identity) with mark_dynamic & co. Empty when none.
std::vector<DimMark> marks_of(const TensorImpl* t);
/// True when any tensor has marks (lets the dispatcher skip mark checks entirely).
bool any_marks();

struct DimDecision {
  sym::DimKind kind = sym::DimKind::Static;
  sym::SymbolConstraint constraint;
  /// The rule that decided, named as in docs/trace-format.md (`dimension_decision.why`): "default",
  /// "allowlist", "mark_dynamic", "maybe_mark_dynamic", "mark_static", "mark_unbacked", "parameter",
  /// "dynamic_off", "pgo", "collectives", "automatic", "dynamic_on", "int_argument".
  const char* why = "default";
};

/// True when `source` (or its tensor source, for "x.size()[0]") is in PROTEAN_DYNAMIC_SOURCES. The
/// variable is re-read on every call (only compiles call this).
bool allowlisted(const std::string& source, const std::string& tensor_source = {});

struct PolicyInput {
  Dynamic mode = Dynamic::Auto;
  bool is_parameter = false;
  bool dynamic_parameters = false;
  const FrameState* frame_state = nullptr;
  const FrameProfile* pgo = nullptr;         // the frame's PGO profile entry (pgo_hooks.h)
  const FrameProfile* collective = nullptr;  // every rank's FrameState joined (collectives.h)
};

/// Decision for dim `dim` of the tensor at `tensor_source` (size source `size_source`).
DimDecision decide_dim(const std::string& tensor_source, const std::string& size_source, size_t dim,
                       const DimMark& mark, const PolicyInput& in);
/// Decision for a SymInt scalar argument (Dynamic or Static).
DimDecision decide_scalar(const std::string& source, bool declared_symbolic, const PolicyInput& in);

/// Writes a `dimension_decision` trace event for dim `dim` of `source` (-1: a scalar) seen with size
/// `value`. `symbolic` says whether the ShapeEnv gave it a symbol: a dynamic decision that got none
/// was 0/1-specialized and is reported as static, why "zero_one". Call only when tracing is on.
void trace_decision(const std::string& compile_id, const std::string& source, int64_t dim, const DimDecision& d,
                    int64_t value, bool symbolic);

}  // namespace protean::dynamic
