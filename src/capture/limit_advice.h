// What the recompile-limit warning tells the user (frame.cpp): which source keeps changing, and how
// to let it vary without recompiling.
#pragma once

#include <span>
#include <string>

#include "capture/frame.h"

namespace protean::capture {

/// Advice lines (each starting with "\n   ") for the last recompile reason of `f` (`"F/C: <guard
/// failure>"`): names the source that keeps changing and what makes it dynamic — SymInt / SymFloat
/// for a plain int64_t / double argument, `pt::mark_dynamic(x, 0);` or PROTEAN_DYNAMIC_SOURCES for a
/// tensor size kept static, the mark or option that keeps a Module attribute static, or the guard
/// that specializes an already symbolic size. Empty when the reason names no source.
std::string limit_advice(const detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                         const std::string& reason);

/// Device of the first defined tensor argument (CPU when there is none): what backend "auto" compiles for.
Device input_device(std::span<const detail::ArgValue> args);

}  // namespace protean::capture
