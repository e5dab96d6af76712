// Counter: a process-wide event count that a struct of counters resets by assignment.
//
// A counter is a std::atomic<int64_t> (incremented from any thread without a lock) that can also be
// copied and assigned, so a struct made only of counters is assignable: `counters = {};` stores 0 in
// every member, and a counter added to the struct later is reset with the others. Assignment is one
// store per counter, not one atomic snapshot of the struct: an increment racing a reset may land on
// either side of it, as with the field-by-field stores it replaces.
#pragma once

#include <atomic>
#include <cstdint>

namespace protean::observe {

class Counter : public std::atomic<int64_t> {
 public:
  constexpr Counter() noexcept : std::atomic<int64_t>(0) {}
  Counter(const Counter& o) noexcept : std::atomic<int64_t>(o.load()) {}
  Counter& operator=(const Counter& o) noexcept {
    store(o.load());
    return *this;
  }
};

}  // namespace protean::observe
