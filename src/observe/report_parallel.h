// A minimal parallel-for for the report (parsing trace lines, writing compile pages): work items are
// handed out in chunks from an atomic counter to at most 8 threads. The first exception thrown by `f`
// is rethrown on the calling thread after every worker has stopped.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace protean::observe::report {

template <class F>
void parallel_for(size_t n, F&& f, size_t chunk = 64) {
  unsigned threads = std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  if (n <= chunk || threads == 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    try {
      for (size_t begin; (begin = next.fetch_add(chunk)) < n;)
        for (size_t i = begin, end = std::min(begin + chunk, n); i < end; ++i) f(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace protean::observe::report
