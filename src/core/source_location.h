// One source location type for the whole project: where in the user's program a node, guard, symbol,
// graph break or runtime assertion came from. The capture layer fills it from the call stack
// (capture/location.h); the IR keeps it on every node (ir::Node::loc); reports read it back from trace
// JSON (observe/report.h).
#pragma once

#include <string>
#include <utility>

namespace protean::core {

/// A place in the user's C++ program.
///
/// `file` is a basename or a path as recorded, `line` is 1-based (0 = unknown), `function` may be empty,
/// or hold why no line is known (capture/location.h's unresolved_location()). `backward` marks a node that
/// a reverse-mode rule recorded for the forward op at file:line (autograd), printed "[bwd of f.cpp:4]".
struct SourceLocation {
  std::string file;
  int line = 0;
  std::string function;
  bool backward = false;

  /// A line is known.
  bool known() const { return line > 0; }
  /// Nothing is known (no file, no line, no function).
  bool empty() const { return file.empty() && line == 0 && function.empty(); }

  /// Short form, as IR comments and reports print it: "mlp.cpp:4"; "mlp.cpp" without a line; "?" when
  /// nothing is known; "[bwd of mlp.cpp:4]" / "[bwd]" for a backward location.
  std::string str() const;
  /// Long form, as error messages print it: "model.cpp:42 in forward"; the function text alone when no
  /// line is known (it says why); "" when empty.
  std::string describe() const;

  bool operator==(const SourceLocation&) const = default;
};

/// While a front end traces one node of a model it imported (an ONNX node), that node: the ops it
/// records carry it as their location (`# onnx node 'gather_3' (Gather)`), and errors at run time name
/// it. Null otherwise; a backward provenance takes precedence.
inline thread_local const SourceLocation* t_frontend_provenance = nullptr;

/// Sets t_frontend_provenance for one scope, restoring the previous one on every exit.
class FrontendProvenanceScope {
 public:
  explicit FrontendProvenanceScope(SourceLocation loc) : prev_(t_frontend_provenance), loc_(std::move(loc)) {
    t_frontend_provenance = &loc_;
  }
  ~FrontendProvenanceScope() { t_frontend_provenance = prev_; }
  FrontendProvenanceScope(const FrontendProvenanceScope&) = delete;
  FrontendProvenanceScope& operator=(const FrontendProvenanceScope&) = delete;

 private:
  const SourceLocation* prev_;
  SourceLocation loc_;
};

}  // namespace protean::core
