// Transport-independent parts of data parallelism (include/protean/distributed.h): the layout check,
// the initial broadcast and the gradient averaging of a data-parallel training step.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "core/device_copy.h"
#include "observe/log.h"
#include "protean/distributed.h"
#include "protean/autograd.h"
#include "protean/error.h"
#include "protean/ops.h"
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

/// Broadcasts `tensors` from rank 0 with one collective per dtype: the tensors of a dtype are packed
/// into one flat tensor on their device, broadcast, and copied back (torch DDP coalesces its buffer
/// broadcast likewise); a dtype with one tensor is broadcast in place. Every rank groups the same
/// layout in the same order (check_same_layout at creation), so the collectives match. Each tensor's
/// version is bumped: its values changed in place (packed copies and caches keyed on them).
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors) {
  std::vector<std::pair<DType, std::vector<size_t>>> by_dtype;  // in first-appearance order
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined() || tensors[i].int_numel() == 0) continue;
    auto it = std::find_if(by_dtype.begin(), by_dtype.end(), [&](const auto& g) { return g.first == tensors[i].dtype(); });
    if (it == by_dtype.end()) it = by_dtype.insert(by_dtype.end(), {tensors[i].dtype(), {}});
    it->second.push_back(i);
  }
  NoGradGuard no_grad;
  for (const auto& [dtype, idx] : by_dtype) {
    if (idx.size() == 1) {
      group.broadcast(tensors[idx[0]], 0);
      increment_version(tensors[idx[0]]);
      continue;
    }
    int64_t total = 0;
    for (size_t i : idx) total += tensors[i].int_numel();
    const Tensor flat = empty({total}, dtype, tensors[idx[0]].device());
    int64_t off = 0;
    for (size_t i : idx) {
      const int64_t n = tensors[i].int_numel();
      core::copy_into(slice(flat, 0, off, off + n, 1), reshape(tensors[i], {SymInt(-1)}), "distributed: a buffer");
      off += n;
    }
    group.broadcast(flat, 0);
    off = 0;
    for (size_t i : idx) {
      const int64_t n = tensors[i].int_numel();
      core::copy_into(tensors[i], reshape(slice(flat, 0, off, off + n, 1), tensors[i].sizes()), "distributed: a buffer");
      increment_version(tensors[i]);
      off += n;
    }
  }
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
  broadcast_coalesced(*s.group, buffers);
  if (observe::log_enabled(observe::LogCat::Pgo))
    observe::log_line(observe::LogCat::Pgo, "",
                      fmt::format("distributed: {} parameter arena(s) and {} buffer(s) broadcast from rank 0 over {} "
                                  "({} ranks)",
                                  arenas.size(), buffers.size(), s.group->name(), s.group->size()));
}

void broadcast_buffers(DataParallelState& s) {
  if (s.group->size() <= 1) return;
  broadcast_coalesced(*s.group, protean::detail::buffers(*s.arenas));
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
