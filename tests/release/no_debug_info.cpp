// Built without debug info (-g0, like a user's Release build; CMakeLists.txt): with no line for any
// user frame, messages must say so and name the compiled function and the op, never a system
// library's source (glibc's libc_start_call_main.h) as the user's line. Exit 0 when they do.
#include <cstdio>
#include <string>

#include "observe/log.h"
#include "protean/protean.h"

namespace pt = protean;

namespace {

int failures = 0;

void expect_contains(const std::string& text, const std::string& part, const char* what) {
  if (text.find(part) != std::string::npos) return;
  std::fprintf(stderr, "FAIL %s: expected \"%s\" in:\n%s\n", what, part.c_str(), text.c_str());
  ++failures;
}
void expect_absent(const std::string& text, const std::string& part, const char* what) {
  if (text.find(part) == std::string::npos) return;
  std::fprintf(stderr, "FAIL %s: unexpected \"%s\" in:\n%s\n", what, part.c_str(), text.c_str());
  ++failures;
}

}  // namespace

int main() {
  const std::string no_info = "(no debug info: build with -g or RelWithDebInfo to see your line)";
  // A graph break under fullgraph: the error names the function and the op.
  auto broken = pt::compile(
      [](const pt::Tensor& x) {
        pt::graph_break("stop here");
        return x + 1.0;
      },
      {.name = "release_fn", .arg_names = {"x"}, .backend = "interp", .fullgraph = true});
  std::string error;
  try {
    broken(pt::randn({4}));
  } catch (const pt::CompileError& e) {
    error = e.what();
  }
  expect_contains(error, "at function 'release_fn', op graph_break " + no_info, "fullgraph error");
  expect_absent(error, "libc_start_call_main", "fullgraph error");
  expect_absent(error, " at ?", "fullgraph error");

  // A guard added by an op's meta function: the dynamic log names the function and the op.
  std::string logs;
  {
    pt::observe::LogCapture capture("dynamic");
    auto add = pt::compile([](const pt::Tensor& x, const pt::Tensor& y) { return x + y; },
                           {.name = "release_add", .arg_names = {"x", "y"}, .backend = "interp"});
    pt::Tensor x = pt::randn({8});
    pt::maybe_mark_dynamic(x, 0);
    add(x, pt::randn({8}));
    logs = capture.str();
  }
  expect_contains(logs, "[guard added] at function 'release_add', op add " + no_info, "guard log");
  expect_absent(logs, "libc_start_call_main", "guard log");

  if (failures == 0) std::printf("messages without debug info: ok\n");
  return failures == 0 ? 0 : 1;
}
