// Graph breaks: what capture cannot take, described for users (reason, op, user line).
//
// A break is raised by capture (tracer.cpp) as GraphBreakError and handled by the frame
// (frame.cpp): under fullgraph it becomes a CompileError; otherwise the frame switches to
// segmented execution (segments.h). Breaks are counted, logged (PROTEAN_LOGS=graph_breaks) and
// traced once per site and frame (report_graph_break in frame.h). See docs/breaks.md.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "protean/error.h"
#include "sym/shape_env.h"

namespace protean::capture {

/// An op the frame's backend rejected, as the frame remembers it: the op kind and the dtypes of its
/// present inputs. Segmented execution breaks at every call that matches.
struct RejectedOp {
  ops::OpKind op;
  std::vector<DType> dtypes;
  std::string why;  // the backend's reason (not part of the match)
  /// True when the call `op(in)` matches (same kind, same dtypes of the defined inputs).
  bool matches(ops::OpKind k, std::span<const Tensor> in) const;
};

/// One graph break: why, which op or host read, and the user's line.
struct BreakInfo {
  std::string reason;     // "Tensor::item() reads tensor data on the host"
  std::string op;         // "item", "nonzero(f32[5])", "graph_break"
  core::SourceLocation loc;  // the user's line (empty when unknown)
  /// Set for an op the backend rejected at artifact build time (UnsupportedOpError) or while a
  /// segment frame was traced: the frame learns it (segments.h). Unset for every other break.
  std::optional<RejectedOp> learn = std::nullopt;
  /// True for an op the backend rejects (changes only the advice of the fullgraph error).
  bool rejected_op = false;
  /// "graph break: <reason> (op <op>) at f.cpp:12"
  std::string text() const;
  /// "f.cpp:12" or "?"
  std::string where() const;
};

/// Thrown by capture at a graph break. The frame turns it into segmented execution, or into a
/// CompileError under fullgraph.
class GraphBreakError : public CompileError {
 public:
  explicit GraphBreakError(BreakInfo b) : CompileError(b.text()), info(std::move(b)) {}
  BreakInfo info;
};

/// A BreakInfo at the calling thread's current user location (one backtrace, ~1 µs).
BreakInfo make_break(std::string reason, std::string op);
/// Throws GraphBreakError(make_break(reason, op)).
[[noreturn]] void throw_graph_break(const std::string& reason, const std::string& op);
/// Reason and op of a host read through `what` ("item()", "data_ptr()", "to_vector()", "str()",
/// "item_symint()").
BreakInfo host_read_break(const char* what);
/// The break for an op the backend rejects: reason "backend '<backend>' does not support <call>:
/// <why>", op <call> ("cumsum(f32[5])").
BreakInfo rejected_op_break(const std::string& backend, const std::string& call, const std::string& why,
                            core::SourceLocation loc);

}  // namespace protean::capture
