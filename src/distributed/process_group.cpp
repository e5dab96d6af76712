// Transport-independent parts of data parallelism (include/protean/distributed.h): the layout check,
// the initial broadcast and the gradient averaging of a data-parallel training step.
#include <fmt/format.h>

#include <chrono>
#include <sstream>

#include "core/device_copy.h"
#include "observe/log.h"
#include "protean/distributed.h"
#include "protean/error.h"
#include "protean/tensor_version.h"

namespace protean::distributed {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

namespace {

std::string describe(const Tensor& t) {
  std::ostringstream o;
  o << short_name(t.dtype()) << "[";
  const auto sizes = t.int_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) o << (i ? "," : "") << sizes[i];
  // the device type only: ranks of one job hold their tensors on their own GPUs (cuda:0, cuda:1)
  o << "]@" << (t.device().type == DeviceType::CPU ? "cpu" : "cuda");
  return o.str();
}

}  // namespace

void check_same_layout(ProcessGroup& group, const std::vector<Tensor>& tensors, const std::string& what) {
  std::string mine = std::to_string(tensors.size());
  for (const Tensor& t : tensors) mine += ";" + describe(t);
  std::vector<std::string> all = group.all_gather_bytes(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == mine) continue;
    throw ValueError(fmt::format(
        "distributed: the {}s differ between rank {} and rank {} ({} vs {}); every rank must build the same "
        "model with the same optimizer param_groups and dtypes",
        what, group.rank(), r, mine, all[r]));
  }
}

void broadcast_tensors(ProcessGroup& group, const std::vector<Tensor>& tensors, int root) {
  if (root < 0 || root >= group.size())
    throw ValueError(fmt::format("distributed::broadcast_tensors: root {} is not a rank of a group of {}", root, group.size()));
  check_same_layout(group, tensors, "tensor");
  for (const Tensor& t : tensors) group.broadcast(t, root);
}

void average_gradients(ProcessGroup& group, const std::vector<Tensor>& grads) {
  for (const Tensor& g : grads) group.all_reduce(g, ReduceOp::Avg);
}

namespace detail {

void sync_initial_parameters(DataParallelState& s) {
  std::vector<Tensor> arenas = protean::detail::param_arenas(*s.arenas);
  check_same_layout(*s.group, arenas, "parameter arena");
  for (const Tensor& a : arenas) s.group->broadcast(a, 0);
  const std::vector<Tensor> buffers = protean::detail::buffers(*s.arenas);
  check_same_layout(*s.group, buffers, "module buffer");
  for (const Tensor& b : buffers) s.group->broadcast(b, 0);
  if (observe::log_enabled(observe::LogCat::Pgo))
    observe::log_line(observe::LogCat::Pgo, "",
                      fmt::format("distributed: {} parameter arena(s) and {} buffer(s) broadcast from rank 0 over {} "
                                  "({} ranks)",
                                  arenas.size(), buffers.size(), s.group->name(), s.group->size()));
}

void broadcast_buffers(DataParallelState& s) {
  if (s.group->size() <= 1) return;
  for (const Tensor& b : protean::detail::buffers(*s.arenas)) {
    s.group->broadcast(b, 0);
    increment_version(b);  // its values changed in place (packed copies and caches keyed on them)
  }
}

void exchange_gradients(DataParallelState& s, std::vector<Tensor>& grads) {
  const auto t0 = std::chrono::steady_clock::now();
  for (Tensor& g : grads) {
    // The exchange writes in place: a gradient that shares its storage with another tensor (a frame
    // input it aliases, as d(sum(w·x))/dw = x does, or another output) is copied first.
    // (a device-to-device copy for gradients on a GPU)
    if (!g.is_contiguous() || g.impl()->storage.use_count() > 1) g = core::copy_of(g);
    s.group->all_reduce(g, ReduceOp::Avg);
    s.all_reduces += 1;
    s.all_reduce_bytes += g.int_numel() * static_cast<int64_t>(g.itemsize());
  }
  s.all_reduce_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

}  // namespace protean::distributed
