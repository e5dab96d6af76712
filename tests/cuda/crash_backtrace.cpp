// The cuda and scenario test binaries print a raw backtrace on SIGSEGV / SIGBUS / SIGABRT (GPU machines often lack a
// debugger): frames as module(+offset), resolved afterwards with addr2line against the unstripped build.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <initializer_list>

namespace {
void on_fatal(int sig) {
  static const char msg[] = "\n[ crash ] fatal signal; backtrace (addr2line -f -C -e MODULE OFFSET):\n";
  (void)!write(2, msg, sizeof msg - 1);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
struct Install {
  Install() {
    for (int s : {SIGSEGV, SIGBUS, SIGABRT}) signal(s, on_fatal);
  }
} install;
}  // namespace
