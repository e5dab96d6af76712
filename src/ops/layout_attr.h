// The `layout` attribute of the ops that run on channels-last storage for the cpu backend's
// conv_layout regions (avg_pool2d, upsample_nearest2d): "nchw" (the default) or "nhwc".
#pragma once

#include <fmt/format.h>

#include <span>
#include <string>

#include "ops/meta_utils.h"
#include "ops/registry.h"

namespace protean::ops {

/// True when `attrs` says layout="nhwc" (input and output stored channels-last). Throws ValueError
/// naming the call for another value and for "nhwc" on an op other than `nhwc_op`.
inline bool layout_is_nhwc(OpKind op, std::span<const Tensor> in, const Attrs& attrs, OpKind nhwc_op) {
  if (!attrs.has("layout")) return false;
  const std::string& v = attrs.s("layout");
  if (v != "nchw" && v != "nhwc")
    throw ValueError(fmt::format("{}: layout must be \"nchw\" or \"nhwc\", got \"{}\"", describe_call(op, in), v));
  if (v == "nhwc" && op != nhwc_op)
    throw ValueError(fmt::format("{}: layout=\"nhwc\" is only supported by {}", describe_call(op, in), op_name(nhwc_op)));
  return v == "nhwc";
}

}  // namespace protean::ops
