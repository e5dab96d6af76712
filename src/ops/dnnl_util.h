// The oneDNN engine and per-thread stream shared by the conv and matmul kernels (src/ops/conv.cpp,
// src/ops/linear.cpp).
#pragma once

#include <dnnl.hpp>

namespace protean::ops {

/// The process's oneDNN CPU engine, created on first use (oneDNN engines may be shared by threads).
inline dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

/// This thread's in-order oneDNN stream on dnnl_engine() (streams are not shared across threads).
inline dnnl::stream& dnnl_stream() {
  static thread_local dnnl::stream strm(dnnl_engine());
  return strm;
}

}  // namespace protean::ops
