#include "core/host_read.h"

namespace protean::core {

namespace {
thread_local HostReadHook* t_hook = nullptr;
}

HostReadHook* current_host_read_hook() { return t_hook; }
HostReadHookScope::HostReadHookScope(HostReadHook* hook) : prev_(t_hook) { t_hook = hook; }
HostReadHookScope::~HostReadHookScope() { t_hook = prev_; }

}  // namespace protean::core
