#include "core/storage_version.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "protean/tensor_version.h"

namespace protean {
namespace core {
namespace {
std::atomic<bool> g_any{false};  // some storage has been bumped (else every version is 0)
std::mutex g_mu;
std::unordered_map<const Storage*, uint64_t>& table() {
  static auto* t = new std::unordered_map<const Storage*, uint64_t>();  // never destroyed: storages die at exit too
  return *t;
}
}  // namespace

uint64_t storage_version(const Storage* s) {
  if (!s || !g_any.load(std::memory_order_acquire)) return 0;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = table().find(s);
  return it == table().end() ? 0 : it->second;
}

void bump_storage_version(const Storage* s) {
  if (!s) return;
  std::lock_guard<std::mutex> lock(g_mu);
  ++table()[s];
  g_any.store(true, std::memory_order_release);
}

void forget_storage_version(const Storage* s) {
  if (!g_any.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  table().erase(s);
}
}  // namespace core

void increment_version(const Tensor& t) {
  if (t.defined() && t.impl()->storage) core::bump_storage_version(t.impl()->storage.get());
}

uint64_t tensor_version(const Tensor& t) {
  return t.defined() && t.impl()->storage ? core::storage_version(t.impl()->storage.get()) : 0;
}

}  // namespace protean
