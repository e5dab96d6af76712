// Tensor: a shared handle to a strided view of refcounted storage (like at::Tensor).
//
// Semantics (mirrors PyTorch):
//  * A Tensor is a handle; copying it shares the same TensorImpl. Views (permute, slice, expand...)
//    share storage with their base and carry their own sizes/strides/storage_offset (in elements).
//  * sizes(), strides(), numel() are SymInts: plain integers in eager code, symbolic while a function
//    is being captured (a FakeTensor: metadata only, no storage).
//  * Storage is 64-byte aligned and freed when the last handle (or DLPack consumer) releases it.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "protean/dtype.h"
#include "protean/error.h"
#include "protean/symint.h"

struct DLManagedTensor;

namespace protean {

/// Refcounted memory: 64-byte-aligned CPU memory, a block of a CUDA device's memory from its
/// caching allocator, or externally owned memory with a deleter.
class Storage {
 public:
  /// Allocates `nbytes` (64-byte aligned, uninitialized). Blocks of 4 MiB and more are 2 MiB aligned,
  /// use transparent huge pages where available and are reused from a process-wide cache of freed
  /// blocks of the same size (at most 512 MiB cached by default: PROTEAN_CPU_ALLOC_CACHE_MB). Throws
  /// RuntimeError when allocation fails.
  explicit Storage(size_t nbytes);
  /// Wraps external memory; `deleter` runs when the last reference goes (may be empty).
  Storage(void* data, size_t nbytes, std::function<void(void*)> deleter);
  /// Allocates `nbytes` on `device`. For a CUDA device the block comes from that device's
  /// stream-ordered caching allocator (256-byte aligned, uninitialized) and goes back to it when the
  /// last reference goes; RuntimeError when there is no CUDA driver or the device is out of memory.
  Storage(size_t nbytes, Device device);
  /// Wraps external memory that lives on `device` (DLPack import of a CUDA tensor).
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  /// Where the bytes live: for a CUDA storage data() is a device address, not readable by the host.
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_ = kCPU;
  std::function<void(void*)> deleter_;
  bool owned_ = false;
};

namespace autograd {
struct AutogradMeta;  // src/autograd/engine.h: grad_fn, output index, accumulated grad
}  // namespace autograd

namespace detail {
/// Link from a tensor to the capture that produced it (opaque to core; owned by src/capture).
struct TraceRef {
  const void* tracer = nullptr;  // the active trace that owns `value`
  int64_t value = -1;            // value id in that trace's graph
};
}  // namespace detail

/// Tensor metadata without data: what meta functions compute and FakeTensors carry.
struct TensorMeta {
  SymIntVec sizes;
  SymIntVec strides;
  SymInt storage_offset = 0;
  DType dtype = DType::F32;
  Device device = kCPU;
  /// Index of the input this output aliases (view ops), or -1.
  int alias_of = -1;
  static TensorMeta contiguous(SymIntVec sizes, DType dtype, Device device = kCPU);
};

/// Row-major (C-order) strides of `sizes`.
SymIntVec contiguous_strides(const SymIntVec& sizes);

struct TensorImpl {
  std::shared_ptr<Storage> storage;  // null for FakeTensors (capture) and undefined tensors
  SymIntVec sizes;
  SymIntVec strides;
  SymInt storage_offset = 0;  // in elements
  DType dtype = DType::F32;
  Device device = kCPU;
  bool requires_grad = false;
  detail::TraceRef trace;  // set while the tensor belongs to a capture
  // ---- autograd (include/protean/autograd.h) ----
  std::shared_ptr<autograd::AutogradMeta> autograd;  // null until requires_grad_ or a recorded op
};

class Tensor {
 public:
  /// An undefined tensor (like `at::Tensor()`); used for absent optional inputs.
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  /// True for capture-time tensors (metadata only).
  bool is_fake() const { return impl_ && !impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- metadata ---------------------------------------------------------------------------------
  const SymIntVec& sizes() const { return ref().sizes; }
  const SymIntVec& strides() const { return ref().strides; }
  /// Size of dim `d`; negative d counts from the end. Throws ValueError when out of range.
  SymInt size(int64_t d) const;
  SymInt stride(int64_t d) const;
  int64_t dim() const { return static_cast<int64_t>(ref().sizes.size()); }
  SymInt numel() const { return sym_product(ref().sizes); }
  SymInt storage_offset() const { return ref().storage_offset; }
  DType dtype() const { return ref().dtype; }
  Device device() const { return ref().device; }
  size_t itemsize() const { return protean::itemsize(dtype()); }
  bool requires_grad() const { return ref().requires_grad; }
  Tensor& set_requires_grad(bool r) { ref().requires_grad = r; return *this; }
  /// C-contiguous (size-1 dims may have any stride). Guards on sizes when symbolic.
  bool is_contiguous() const;
  /// Concrete sizes/strides; throws when symbolic (for kernels and host code).
  IntVec int_sizes() const;
  IntVec int_strides() const;
  int64_t int_numel() const;
  TensorMeta meta() const;

  // ---- data (host reads: a graph break under capture) -----------------------------------------
  /// Pointer to the first element (storage + offset). Throws if fake or undefined. For a CUDA tensor
  /// it is a device address (for kernels and DLPack), which host code must not dereference.
  void* data_ptr() const;
  template <typename T> T* data_ptr() const { return static_cast<T*>(data_ptr()); }
  /// The single element as T (numel must be 1). Converts from the stored dtype.
  template <typename T> T item() const;
  /// The single element of an integer or bool tensor as a SymInt: PyTorch's `x.item()` under
  /// torch._dynamo.config.capture_scalar_outputs, which traces to `aten._local_scalar_dense` and an
  /// unbacked SymInt. In eager code (and on real tensors) the value. While a function compiled with
  /// CompileOptions::capture_scalar_outputs is traced: a fresh unbacked symbol u<n> (its range follows
  /// the dtype: [0, 1] for bool, [0, 255] for u8, ...) recorded as a `local_scalar_dense` node. Later
  /// ops may use it in sizes (`full({n}, 0.0)`, `narrow(x, 0, 0, n)`); its first use as a size makes it
  /// size-like and asserts n >= 0 when the graph runs. Backends bind it from the actual value on
  /// every call, so a new value neither recompiles nor breaks. A guard on it (`if (n > 3)`) cannot be
  /// decided while tracing: a graph break ("data-dependent guard"); protean::check(n <= x.size(0))
  /// asserts a fact instead. Without capture_scalar_outputs it is a host read, a graph break like
  /// item(). Throws TypeError for floating dtypes, ValueError when numel != 1. docs/breaks.md.
  SymInt item_symint() const;
  /// Copy of the elements in row-major order, converted to T.
  template <typename T> std::vector<T> to_vector() const;

  // ---- conversions ----------------------------------------------------------------------------
  Tensor to(DType dtype) const;
  /// A copy on `device` (this tensor when it is already there), like torch's `x.to("cuda:0")`. The
  /// result is contiguous. Host → device and device → host go through the device's stream; a copy to
  /// the host has finished when `to` returns. Throws RuntimeError when `device` is CUDA and no driver
  /// or device is present ("... no CUDA driver found ..."), ValueError for a FakeTensor.
  Tensor to(Device device) const;
  /// Same as to(kCPU).
  Tensor cpu() const;
  Tensor contiguous() const;
  Tensor clone() const;
  std::string str() const;  // PyTorch-like printing: tensor([[1., 2.], ...]) with shape/dtype
  /// Zero-copy DLPack export (the tensor's storage stays alive until the consumer calls the deleter).
  /// A CUDA tensor is exported as kDLCUDA with its device index, after Protean's stream has finished
  /// the work queued on it, so the consumer may read it on any stream.
  DLManagedTensor* to_dlpack() const;

  // ---- ops as methods (see ops.h for semantics) -------------------------------------------------
  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  Tensor matmul(const Tensor& o) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor sum(const IntVec& dims = {}, bool keepdim = false) const;
  Tensor mean(const IntVec& dims = {}, bool keepdim = false) const;
  Tensor amax(const IntVec& dims = {}, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor reshape(const SymIntVec& shape) const;
  Tensor view(const SymIntVec& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(const IntVec& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor expand(const SymIntVec& sizes) const;
  Tensor squeeze(const IntVec& dims = {}) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor slice(int64_t dim, const SymInt& start, const SymInt& end, const SymInt& step = 1) const;
  Tensor select(int64_t dim, const SymInt& index) const;
  Tensor narrow(int64_t dim, const SymInt& start, const SymInt& length) const;

  // ---- autograd (libtorch's names; src/autograd, include/protean/autograd.h) -----------------------
  /// Makes this tensor a leaf that records the ops applied to it (torch.Tensor.requires_grad_).
  /// Throws TypeError for a non-floating dtype and ValueError for a non-leaf (an op's result).
  Tensor& requires_grad_(bool requires_grad = true);
  /// The gradient accumulated by backward() (undefined before the first backward or after
  /// set_grad({})/zero_grad).
  Tensor grad() const;
  /// Replaces the accumulated gradient (undefined = none, torch's `p.grad = None`). As torch's
  /// `p.grad = g`, g must have this tensor's sizes (ShapeError), dtype (TypeError) and device
  /// (ValueError), so an optimizer's step() never meets a gradient it cannot apply.
  void set_grad(const Tensor& g);
  /// True for tensors that no recorded op produced (user tensors, parameters).
  bool is_leaf() const;
  /// Name of the op that produced this tensor under autograd ("mul", ...), empty for leaves.
  std::string grad_fn_name() const;
  /// Runs reverse-mode differentiation from this tensor and accumulates into the leaves' grad()
  /// (torch.Tensor.backward). `gradient` defaults to 1 for a one-element tensor; otherwise it is
  /// required (ValueError). The recorded graph is freed afterwards.
  void backward(const Tensor& gradient = {}) const;
  /// A tensor sharing this one's storage (and capture value) without autograd history.
  Tensor detach() const;

 private:
  TensorImpl& ref() const {
    if (!impl_) throw ValueError("operation on an undefined Tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- factories ----------------------------------------------------------------------------------
/// Uninitialized contiguous tensor.
Tensor empty(const IntVec& sizes, DType dtype = DType::F32);
Tensor empty_strided(const IntVec& sizes, const IntVec& strides, DType dtype = DType::F32);
Tensor zeros(const IntVec& sizes, DType dtype = DType::F32);
Tensor ones(const IntVec& sizes, DType dtype = DType::F32);
/// The same factories on a device (torch's `device=` argument). On a CUDA device `empty` takes a
/// block from the caching allocator, `zeros` clears it with cuMemsetD8Async, and `full`, `ones`,
/// `rand` and `randn` fill on the host and copy once (the values equal the CPU factories' for the
/// same seed). RuntimeError without a CUDA driver.
Tensor empty(const IntVec& sizes, DType dtype, Device device);
Tensor zeros(const IntVec& sizes, DType dtype, Device device);
Tensor ones(const IntVec& sizes, DType dtype, Device device);
Tensor full(const IntVec& sizes, double value, DType dtype, Device device);
Tensor rand(const IntVec& sizes, DType dtype, Device device);
Tensor randn(const IntVec& sizes, DType dtype, Device device);
/// True when a CUDA driver and at least one device are present (torch.cuda.is_available()).
bool cuda_is_available();
/// Number of CUDA devices (0 without a driver).
int cuda_device_count();
/// Tensor filled with `value`. Traceable: under capture it becomes a `full` node.
Tensor full(const SymIntVec& sizes, double value, DType dtype = DType::F32);
/// [start, end) with `step` (like torch.arange). Traceable with symbolic end.
Tensor arange(const SymInt& start, const SymInt& end, const SymInt& step = 1, DType dtype = DType::I64);
Tensor arange(const SymInt& end, DType dtype = DType::I64);
/// 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, DType dtype = DType::F32);
/// Copies `values` into a new tensor of `sizes` (numel must match).
template <typename T> Tensor tensor(const std::vector<T>& values, const IntVec& sizes);
/// Uniform [0, 1) / standard normal, from the global generator (seed with manual_seed).
Tensor rand(const IntVec& sizes, DType dtype = DType::F32);
Tensor randn(const IntVec& sizes, DType dtype = DType::F32);
/// Uniform integers in [low, high).
Tensor randint(int64_t low, int64_t high, const IntVec& sizes, DType dtype = DType::I64);
/// Seeds the global generator (a mt19937_64). Same seed ⇒ same sequence on every machine.
void manual_seed(uint64_t seed);
/// Wraps external memory without copying. `strides` empty = contiguous. `deleter` may be empty
/// (caller keeps the memory alive).
Tensor from_blob(void* data, const IntVec& sizes, DType dtype, const IntVec& strides = {},
                 std::function<void(void*)> deleter = {});
/// Zero-copy DLPack import: takes ownership of `managed` (calls its deleter when done). CPU
/// (kDLCPU) and CUDA (kDLCUDA, device id = cuda index) tensors with a Protean dtype are accepted
/// (FormatError otherwise). A CUDA tensor's producer must have finished writing it (PyTorch's
/// `__dlpack__(stream=...)` synchronisation is the caller's job).
Tensor from_dlpack(DLManagedTensor* managed);

// ---- .npy I/O -------------------------------------------------------------------------------------
/// Loads a NumPy .npy file (format 1.0/2.0/3.0, little-endian; C or Fortran order; dtypes
/// <f2 <f4 <f8 <i1 <i4 <i8 |u1 |b1, and <i2 <u2 widened to i32, <u4 <u8 widened to i64 (a uint64 value
/// at or above 2^63 is a FormatError)). bfloat16 has no NumPy dtype: files hold its uint16 bit patterns
/// ('<u2'), which core::load_npy_for(path, DType::BF16) reads back as bf16. Throws FormatError naming
/// the file and the problem (bad magic, truncated, big-endian, unsupported dtype).
Tensor load_npy(const std::string& path);
/// Saves as .npy 1.0 (C order, little-endian); a bf16 tensor is written as its uint16 bit patterns
/// ('<u2'). Throws RuntimeError when the file cannot be written.
void save_npy(const std::string& path, const Tensor& t);

}  // namespace protean
