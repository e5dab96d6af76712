// Shared by the libFuzzer targets: the contract every target checks is that bad input is a
// protean::Error (a message naming what and where), never another exception type, a crash, a hang
// or an allocation proportional to a size field rather than to the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "protean/error.h"

namespace protean::fuzz {

/// Runs `fn`; a protean::Error is the expected answer to bad input, anything else aborts (a finding).
template <typename F>
void expect_only_protean_errors(const char* target, F&& fn) {
  try {
    fn();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: an exception that is not a protean::Error escaped: %s\n", target, e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s: a non-std exception escaped\n", target);
    std::abort();
  }
}

}  // namespace protean::fuzz
