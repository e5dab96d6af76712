// PyTorch-like tensor printing (to be refined: summarization of large tensors, sci-mode).
#include <fmt/format.h>

#include <ostream>
#include <sstream>

#include "protean/tensor.h"

namespace protean {

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  if (is_fake()) return fmt::format("FakeTensor(size={}, dtype={})", to_string(sizes()), torch_name(dtype()));
  std::vector<double> v = to_vector<double>();
  IntVec sz = int_sizes();
  std::ostringstream os;
  os << "tensor(";
  size_t idx = 0;
  std::function<void(size_t)> rec = [&](size_t d) {
    if (d == sz.size()) {
      os << fmt::format("{:.4f}", v[idx++]);
      return;
    }
    os << "[";
    for (int64_t i = 0; i < sz[d]; ++i) {
      if (i) os << ", ";
      rec(d + 1);
    }
    os << "]";
  };
  rec(0);
  if (dtype() != DType::F32) os << ", dtype=" << torch_name(dtype());
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace protean
