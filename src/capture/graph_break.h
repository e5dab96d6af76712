// Graph breaks: what capture cannot take, described for users (reason, op, user line).
//
// A break is raised by capture (tracer.cpp) as GraphBreakError and handled by the frame
// (frame.cpp): under fullgraph it becomes a CompileError; otherwise the frame switches to
// segmented execution (segments.h). Breaks are counted, logged (PROTEAN_LOGS=graph_breaks) and
// traced once per site and frame (report_graph_break in frame.h). See docs/breaks.md.
#pragma once

#include <string>

#include "protean/error.h"
#include "sym/shape_env.h"

namespace protean::capture {

/// One graph break: why, which op or host read, and the user's line.
struct BreakInfo {
  std::string reason;     // "Tensor::item() reads tensor data on the host"
  std::string op;         // "item", "nonzero(f32[5])", "graph_break"
  sym::UserLocation loc;  // the user's line (empty when unknown)
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
/// Reason and op of a host read through `what` ("item()", "data_ptr()", "to_vector()", "str()").
BreakInfo host_read_break(const char* what);

}  // namespace protean::capture
