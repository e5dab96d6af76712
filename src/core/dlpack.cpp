// DLPack import/export (dlpack.h as shipped by Debian's libdlpack-dev: DLPACK_VERSION 60, the
// unversioned DLManagedTensor ABI). Both directions are zero-copy.
//
// Export: the DLManagedTensor's manager_ctx owns a Tensor handle (keeping the storage alive) plus the
// shape/stride arrays; `data` points at the first element (storage offset applied, byte_offset 0, as
// PyTorch does). The consumer calls `deleter` exactly once when done.
// Import: the tensor wraps the producer's memory; the producer's deleter runs when the last Protean
// reference to that storage goes. If from_dlpack rejects the tensor (FormatError) it does not call the
// deleter: the caller still owns `managed`.
// dtype codes: kDLFloat 16/32/64, kDLBfloat 16, kDLInt 8/32/64, kDLUInt 8, and bool as code 6
// (kDLBool, added in DLPack 0.8; this header predates it) with 8 bits.
#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include "device/runtime.h"
#include "core/checked_size.h"
#include "protean/tensor.h"

namespace protean {

namespace {

constexpr uint8_t kBoolCode = 6;  // kDLBool in DLPack >= 0.8

DLDataType to_dl(DType t) {
  DLDataType d{};
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(itemsize(t) * 8);
  switch (t) {
    case DType::Bool: d.code = kBoolCode; break;
    case DType::U8: d.code = kDLUInt; break;
    case DType::I8: case DType::I32: case DType::I64: d.code = kDLInt; break;
    case DType::F16: case DType::F32: case DType::F64: d.code = kDLFloat; break;
    case DType::BF16: d.code = kDLBfloat; break;
  }
  return d;
}

DType from_dl(DLDataType d) {
  if (d.lanes != 1)
    throw FormatError(fmt::format("from_dlpack: vector dtypes (lanes = {}) are not supported; expected lanes = 1",
                                  d.lanes));
  switch (d.code) {
    case kDLFloat:
      if (d.bits == 16) return DType::F16;
      if (d.bits == 32) return DType::F32;
      if (d.bits == 64) return DType::F64;
      break;
    case kDLBfloat:
      if (d.bits == 16) return DType::BF16;
      break;
    case kDLInt:
      if (d.bits == 8) return DType::I8;
      if (d.bits == 32) return DType::I32;
      if (d.bits == 64) return DType::I64;
      break;
    case kDLUInt:
      if (d.bits == 8) return DType::U8;
      break;
    case kBoolCode:
      if (d.bits == 8) return DType::Bool;
      break;
    default: break;
  }
  throw FormatError(fmt::format("from_dlpack: unsupported dtype (code {}, {} bits); Protean supports float 16/32/64, "
                                "bfloat 16, int 8/32/64, uint 8 and bool",
                                d.code, d.bits));
}

struct ExportCtx {
  DLManagedTensor managed{};
  Tensor keep;
  std::vector<int64_t> shape, strides;
};

void export_deleter(DLManagedTensor* self) {
  if (self) delete static_cast<ExportCtx*>(self->manager_ctx);
}

}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  if (!defined()) throw ValueError("to_dlpack: the tensor is undefined");
  if (is_fake())
    throw ValueError("to_dlpack: a capture-time FakeTensor has no data to export (call it outside the compiled "
                     "function)");
  // A CUDA tensor's pending writes are on Protean's stream; the consumer may read on any stream.
  if (device().type == DeviceType::CUDA) cuda::synchronize(device().index);
  auto* ctx = new ExportCtx;
  ctx->keep = *this;
  ctx->shape = int_sizes();
  ctx->strides = int_strides();
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = int_numel() == 0 ? impl()->storage->data() : data_ptr();
  switch (device().type) {
    case DeviceType::CPU: t.device = DLDevice{kDLCPU, 0}; break;
    case DeviceType::CUDA: t.device = DLDevice{kDLCUDA, device().index}; break;
  }
  t.ndim = static_cast<int>(ctx->shape.size());
  t.dtype = to_dl(dtype());
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = export_deleter;
  return &ctx->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  if (!managed) throw ValueError("from_dlpack: null DLManagedTensor");
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDA)
    throw FormatError(fmt::format("from_dlpack: only CPU (kDLCPU) and CUDA (kDLCUDA) tensors are supported, got "
                                  "device type {} (id {})",
                                  static_cast<int>(t.device.device_type), t.device.device_id));
  if (t.device.device_type == kDLCUDA && t.device.device_id < 0)
    throw FormatError(fmt::format("from_dlpack: negative CUDA device id {}", t.device.device_id));
  DType dt = from_dl(t.dtype);
  if (t.ndim < 0) throw FormatError(fmt::format("from_dlpack: negative ndim {}", t.ndim));
  IntVec sizes(t.shape, t.shape + t.ndim), strides;
  for (int64_t s : sizes)
    if (s < 0) throw FormatError(fmt::format("from_dlpack: negative size in shape {}", to_string(to_symint_vec(sizes))));
  if (t.strides) {
    strides.assign(t.strides, t.strides + t.ndim);
    for (int64_t s : strides)
      if (s < 0)
        throw FormatError(fmt::format("from_dlpack: negative strides {} are not supported",
                                      to_string(to_symint_vec(strides))));
  } else {
    strides.resize(sizes.size());
    int64_t acc = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      strides[i] = acc;
      acc *= std::max<int64_t>(sizes[i], 1);
    }
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  auto release = [managed](void*) {
    if (managed->deleter) managed->deleter(managed);
  };
  if (t.device.device_type == kDLCPU) return from_blob(data, sizes, dt, strides, release);
  // A CUDA tensor: the same view over device memory. Its storage is the producer's; nothing is copied.
  const int64_t extent = core::checked_extent(sizes, strides, itemsize(dt), "from_dlpack");
  const Device dev{DeviceType::CUDA, t.device.device_id};
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, static_cast<size_t>(extent) * itemsize(dt), dev, release);
  impl->sizes = to_symint_vec(sizes);
  impl->strides = to_symint_vec(strides);
  impl->dtype = dt;
  impl->device = dev;
  return Tensor(std::move(impl));
}

}  // namespace protean
