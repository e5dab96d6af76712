// The .npy reader on bytes already in memory (fuzz targets, embedded inputs); load_npy (tensor.h)
// reads a file with the same checks.
#pragma once

#include <string>
#include <string_view>

#include "protean/tensor.h"

namespace protean::core {

/// Parses `bytes` as a .npy file (format 1.0-3.0, the dtypes save_npy writes, C or Fortran order).
/// FormatError (naming `name`) for anything malformed, ShapeError for a shape whose byte count does
/// not fit in 64 bits; never reads outside `bytes`.
Tensor load_npy_bytes(std::string_view bytes, const std::string& name);

/// load_npy for a value of dtype `want`: for BF16, a '<u2' file holds bfloat16 bit patterns (NumPy has
/// no bfloat16; ONNX's test data and save_npy use this convention) and loads as bf16; any other file,
/// and any other `want`, loads as load_npy does.
Tensor load_npy_for(const std::string& path, DType want);

}  // namespace protean::core
