#include "protean/tensor.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "device/runtime.h"
#include "core/checked_size.h"
#include "core/host_read.h"
#include "core/host_blocks.h"
#include "core/storage_version.h"
#include "core/strided_copy.h"

namespace protean {

// ---- Storage ------------------------------------------------------------------------------------
// Large blocks (>= 1 MiB) are kept for reuse instead of being returned to the system, and blocks of
// 4 MiB and more are 2 MiB aligned and marked MADV_HUGEPAGE. Unmapping a block and mapping it again
// makes every call of a model re-fault its activations page by page; in a VM a fault costs
// microseconds: PP-OCR det at 640x640 spent more than half its time there (190 ms of CPU per call,
// 75 ms with the blocks reused), and allocating + touching 64 MiB took 450 ms with 4 KiB pages vs
// 5-9 ms with transparent huge pages. Blocks are bucketed by size (rounded up to 64 KiB, or to 2 MiB
// for huge blocks); a request takes the smallest kept block of at least its size and at most twice
// it (best fit), so a loop whose shapes vary (a training step over changing sequence lengths) reuses
// its larger blocks instead of keeping one block per size seen and faulting in a new one.
//
// What is kept never raises the peak: the bytes of large blocks in use plus the bytes kept stay at
// most the largest number of bytes of large blocks that were ever in use at once (a new block that
// would break this first unmaps kept blocks, the largest first). A program that cycles through
// shapes therefore peaks about where it would without the cache (train_bench's GPT training step
// over 8 sequence lengths peaked at 745 MiB with a fixed 512 MiB allowance, 470 MiB with this rule).
// PROTEAN_CPU_ALLOC_CACHE_MB (default 512; 0 disables) bounds the kept bytes as well.
//
// Large blocks are mapped with mmap, not malloc: glibc raises its mmap threshold (up to 32 MiB)
// each time it unmaps a block it mapped, and later blocks below the threshold are then carved from
// the heap, whose freed memory it rarely returns to the system (the same GPT step ended about
// 60 MiB higher that way). Off under AddressSanitizer (malloc, nothing kept) so it still sees every use
// after free.
namespace {
constexpr size_t kCacheMin = size_t{1} << 20;
constexpr size_t kBucket = size_t{64} << 10;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = 2 * kHugePage;
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapLarge = false;
#else
constexpr bool kMapLarge = true;
#endif

size_t round_alloc(size_t nbytes) {
  size_t n = (nbytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  if (n >= kHugeMin) return (n + kHugePage - 1) / kHugePage * kHugePage;
  if (n >= kCacheMin) n = (n + kBucket - 1) / kBucket * kBucket;
  return n;
}

/// The first bytes of a block for a request of `want` bytes that are marked MADV_HUGEPAGE: the whole
/// huge pages the request fills. A huge page is faulted in whole on its first touch, so marking the
/// rounded-up tail made the last partial page resident in full (train_bench's MLP: its three 7.1 MiB
/// parameter and state arenas were 8 MiB resident each, its 17.2 MiB slot block 18 MiB); the tail
/// gets 4 KiB pages, touched as used.
size_t huge_prefix(size_t want) { return want / kHugePage * kHugePage; }

/// A fresh block of n bytes (n from round_alloc) for a request of `want` bytes: mmap for large blocks
/// (2 MiB aligned from 4 MiB, their huge_prefix(want) marked MADV_HUGEPAGE), aligned_alloc for the
/// rest; nullptr when out of memory.
void* fresh_block(size_t n, size_t want) {
  if (!kMapLarge || n < kCacheMin) {
    if (n < kHugeMin) return std::aligned_alloc(64, n);
    void* p = std::aligned_alloc(kHugePage, n);
    if (p && huge_prefix(want) > 0) (void)madvise(p, huge_prefix(want), MADV_HUGEPAGE);  // advisory: ignored where THP is off
    return p;
  }
  const size_t extra = n >= kHugeMin ? kHugePage : 0;  // room to align the start to a huge page
  void* m = mmap(nullptr, n + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(m);
  if (!extra) return base;
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage);
  if (p > base) (void)munmap(base, static_cast<size_t>(p - base));
  if (size_t tail = static_cast<size_t>(base + n + extra - (p + n)); tail > 0) (void)munmap(p + n, tail);
  if (huge_prefix(want) > 0) (void)madvise(p, huge_prefix(want), MADV_HUGEPAGE);
  return p;
}
/// Returns a block of n bytes (its real size) to the system.
void free_block(void* p, size_t n) {
  if (!kMapLarge || n < kCacheMin) std::free(p);
  else (void)munmap(p, n);
}

thread_local int t_return_freed = 0;  // ReturnFreedBlocksScope's alive on this thread

struct BlockCache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;  // by block size
  std::unordered_map<void*, size_t> issued;           // blocks given out for a smaller request: their size
  size_t held = 0;  // bytes kept in free_blocks
  size_t live = 0;  // bytes of large blocks in use
  size_t peak = 0;  // the most bytes of large blocks ever in use at once
  size_t cap = 0;
  size_t returned = 0;  // bytes unmapped because a ReturnFreedBlocksScope was alive
  BlockCache() {
    if (!kMapLarge) return;
    cap = size_t{512} << 20;
    if (const char* env = std::getenv("PROTEAN_CPU_ALLOC_CACHE_MB"); env && *env) {
      char* end = nullptr;
      long long mb = std::strtoll(env, &end, 10);
      if (end && *end == '\0' && mb >= 0) cap = static_cast<size_t>(mb) << 20;
      else std::fprintf(stderr, "protean: warning: PROTEAN_CPU_ALLOC_CACHE_MB=\"%s\" is not a size in MiB; using 512\n", env);
    }
  }
  /// A block for a request of `want` bytes, n = round_alloc(want): the smallest kept block of at
  /// least n bytes and at most twice n (best fit), else a fresh one; nullptr when out of memory.
  void* take(size_t n, size_t want) {
    if (!kMapLarge || n < kCacheMin) return fresh_block(n, want);
    std::vector<std::pair<void*, size_t>> evicted;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free_blocks.lower_bound(n);
      while (it != free_blocks.end() && it->second.empty()) it = free_blocks.erase(it);
      // The smallest kept block of at least n bytes serves the request when it is at most twice n, or
      // when a fresh block would have to push kept ones out (live + n + held over the peak): then a
      // larger block used as it is costs no memory that is not already held, where unmapping it
      // would make the next request of its size map it again. (Without that, a call that takes its
      // blocks back in another order than it took them unmaps and maps the same blocks every call:
      // 8 pairs and ~4,300 page faults per call of PP-OCRv4 rec at width 960.)
      if (it != free_blocks.end() && (it->first <= 2 * n || live + n + held > peak)) {
        p = it->second.back();
        it->second.pop_back();
        held -= it->first;
        live += it->first;
        peak = std::max(peak, live);
        if (it->first != n) issued[p] = it->first;
        return p;
      }
      live += n;
      peak = std::max(peak, live);
      // Keep live + held within the peak: unmap kept blocks, the largest first.
      while (held > 0 && live + held > peak) {
        auto last = std::prev(free_blocks.end());
        if (last->second.empty()) {
          free_blocks.erase(last);
          continue;
        }
        evicted.emplace_back(last->second.back(), last->first);
        last->second.pop_back();
        held -= last->first;
      }
    }
    for (auto [q, size] : evicted) free_block(q, size);
    p = fresh_block(n, want);
    if (!p) {
      std::lock_guard<std::mutex> lock(mu);
      live -= n;
    }
    return p;
  }
  /// Takes back the block at p that was asked for as n bytes (its real size when take() gave a
  /// larger one): kept when the kept bytes stay within the cap and live + kept within the peak, and
  /// no ReturnFreedBlocksScope is alive on this thread.
  void give(void* p, size_t n) {
    if (!kMapLarge || n < kCacheMin) {
      free_block(p, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto i = issued.find(p); i != issued.end()) {
        n = i->second;
        issued.erase(i);
      }
      live -= std::min(live, n);
      if (t_return_freed == 0 && held + n <= cap && live + held + n <= peak) {
        free_blocks[n].push_back(p);
        held += n;
        return;
      }
      if (t_return_freed > 0) returned += n;
    }
    free_block(p, n);
  }
};
BlockCache& block_cache() {
  static auto* c = new BlockCache;  // never destroyed: storages may die during static destruction
  return *c;
}
}  // namespace

namespace core {
ReturnFreedBlocksScope::ReturnFreedBlocksScope() { ++t_return_freed; }
ReturnFreedBlocksScope::~ReturnFreedBlocksScope() { --t_return_freed; }
size_t cached_host_block_bytes() {
  BlockCache& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.held;
}
size_t returned_host_block_bytes() {
  BlockCache& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.returned;
}
}  // namespace core

Storage::Storage(size_t nbytes) : nbytes_(nbytes), owned_(true) {
  core::check_host_allocation(nbytes);
  data_ = block_cache().take(round_alloc(nbytes), nbytes);
  if (!data_) throw RuntimeError(fmt::format("out of memory allocating {} bytes", nbytes));
}
Storage::Storage(void* data, size_t nbytes, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), deleter_(std::move(deleter)) {}
Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}
Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  switch (device.type) {
    case DeviceType::CPU: {
      core::check_host_allocation(nbytes);
      owned_ = true;
      data_ = block_cache().take(round_alloc(nbytes), nbytes);
      if (!data_) throw RuntimeError(fmt::format("out of memory allocating {} bytes", nbytes));
      return;
    }
    case DeviceType::CUDA: {
      const int index = device.index;
      data_ = reinterpret_cast<void*>(cuda::device_allocate(index, nbytes));
      deleter_ = [index, nbytes](void* p) { cuda::device_free(index, reinterpret_cast<cuda::CUdeviceptr>(p), nbytes); };
      return;
    }
  }
}
Storage::~Storage() {
  core::forget_storage_version(this);  // a new storage at this address starts at version 0
  if (owned_) {
    block_cache().give(data_, round_alloc(nbytes_));
  } else if (deleter_) {
    deleter_(data_);
  }
}

// ---- metadata helpers ---------------------------------------------------------------------------
SymIntVec contiguous_strides(const SymIntVec& sizes) {
  SymIntVec st(sizes.size());
  SymInt acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc = acc * sizes[i];
  }
  return st;
}

TensorMeta TensorMeta::contiguous(SymIntVec sizes, DType dtype, Device device) {
  TensorMeta m;
  m.strides = contiguous_strides(sizes);
  m.sizes = std::move(sizes);
  m.dtype = dtype;
  m.device = device;
  return m;
}

namespace {
int64_t wrap(int64_t d, int64_t rank) {
  if (d < -rank || d >= rank)
    throw ValueError(fmt::format("dim {} out of range for a tensor of rank {} (valid: [{}, {}])", d, rank, -rank,
                                 rank - 1));
  return d < 0 ? d + rank : d;
}
}  // namespace

SymInt Tensor::size(int64_t d) const { return ref().sizes[static_cast<size_t>(wrap(d, dim()))]; }
SymInt Tensor::stride(int64_t d) const { return ref().strides[static_cast<size_t>(wrap(d, dim()))]; }

bool Tensor::is_contiguous() const {
  const auto& sz = ref().sizes;
  const auto& st = ref().strides;
  SymInt expected = 1;
  for (size_t i = sz.size(); i-- > 0;) {
    if (static_cast<bool>(sz[i] == 1)) continue;
    if (!static_cast<bool>(st[i] == expected)) return false;
    expected = expected * sz[i];
  }
  return true;
}

IntVec Tensor::int_sizes() const {
  IntVec r;
  r.reserve(ref().sizes.size());
  for (const auto& s : ref().sizes) {
    if (s.is_symbolic()) throw ValueError("int_sizes() on a tensor with symbolic sizes " + to_string(sizes()));
    r.push_back(s.hint());
  }
  return r;
}
IntVec Tensor::int_strides() const {
  IntVec r;
  r.reserve(ref().strides.size());
  for (const auto& s : ref().strides) {
    if (s.is_symbolic()) throw ValueError("int_strides() on a tensor with symbolic strides " + to_string(strides()));
    r.push_back(s.hint());
  }
  return r;
}
int64_t Tensor::int_numel() const { return core::checked_numel(int_sizes(), "numel()"); }

TensorMeta Tensor::meta() const {
  TensorMeta m;
  m.sizes = ref().sizes;
  m.strides = ref().strides;
  m.storage_offset = ref().storage_offset;
  m.dtype = ref().dtype;
  m.device = ref().device;
  return m;
}

void* Tensor::data_ptr() const {
  if (auto* h = core::current_host_read_hook()) h->on_host_read(*this, "data_ptr()");
  if (!ref().storage)
    throw ValueError("data_ptr() on a capture-time FakeTensor: its data does not exist while tracing");
  return static_cast<char*>(ref().storage->data()) + ref().storage_offset.hint() * static_cast<int64_t>(itemsize());
}

SymInt Tensor::item_symint() const {
  if (!is_integral(dtype(), /*include_bool=*/true))
    throw TypeError(fmt::format("item_symint(): needs an integer or bool tensor, got {} (shape {}); read a floating "
                                "tensor with item<double>()",
                                short_name(dtype()), to_string(sizes())));
  if (auto* h = core::current_host_read_hook()) {
    if (std::optional<SymInt> s = h->on_item_symint(*this)) return *s;
    h->on_host_read(*this, "item_symint()");
  }
  core::HostReadHookScope read(nullptr);  // the hook has seen this read; the tensor is real from here on
  return SymInt(item<int64_t>());
}

template <typename T>
T Tensor::item() const {
  if (auto* h = core::current_host_read_hook()) h->on_host_read(*this, "item()");
  if (device().type != DeviceType::CPU && !is_fake()) return cpu().item<T>();
  if (int_numel() != 1)
    throw ValueError(fmt::format("item(): tensor has {} elements, expected exactly 1 (shape {})", int_numel(),
                                 to_string(sizes())));
  core::HostReadHookScope read(nullptr);  // the hook has seen this read; the tensor is real from here on
  const void* p = data_ptr();
  return dispatch_dtype(dtype(), [&]<typename S>() -> T {
    if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
      return static_cast<T>(static_cast<float>(*static_cast<const S*>(p)));
    else
      return static_cast<T>(*static_cast<const S*>(p));
  });
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if (auto* h = core::current_host_read_hook()) h->on_host_read(*this, "to_vector()");
  core::HostReadHookScope read(nullptr);  // the hook has seen this read; the tensor is real from here on
  Tensor c = device().type == DeviceType::CPU ? contiguous() : cpu();
  int64_t n = c.int_numel();
  std::vector<T> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const void* p = c.data_ptr();
  dispatch_dtype(dtype(), [&]<typename S>() {
    const S* s = static_cast<const S*>(p);
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
        out[static_cast<size_t>(i)] = static_cast<T>(static_cast<float>(s[i]));
      else
        out[static_cast<size_t>(i)] = static_cast<T>(s[i]);
    }
  });
  return out;
}

#define PROTEAN_INSTANTIATE(T)                  \
  template T Tensor::item<T>() const;           \
  template std::vector<T> Tensor::to_vector<T>() const;
PROTEAN_INSTANTIATE(float)
PROTEAN_INSTANTIATE(double)
PROTEAN_INSTANTIATE(int64_t)
PROTEAN_INSTANTIATE(int32_t)
PROTEAN_INSTANTIATE(int8_t)
PROTEAN_INSTANTIATE(uint8_t)
PROTEAN_INSTANTIATE(bool)
#undef PROTEAN_INSTANTIATE

// ---- factories ----------------------------------------------------------------------------------
Tensor empty_strided(const IntVec& sizes, const IntVec& strides, DType dtype) {
  if (sizes.size() != strides.size())
    throw ValueError(fmt::format("empty_strided: {} sizes but {} strides", sizes.size(), strides.size()));
  const int64_t extent = core::checked_extent(sizes, strides, itemsize(dtype), "empty_strided");  // 1 + max offset
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(extent) * itemsize(dtype));
  impl->sizes = to_symint_vec(sizes);
  impl->strides = to_symint_vec(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor empty(const IntVec& sizes, DType dtype) {
  core::checked_nbytes(sizes, itemsize(dtype), "empty");  // before the strides' products can wrap
  IntVec st(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return empty_strided(sizes, st, dtype);
}

// ---- devices -------------------------------------------------------------------------------------
bool cuda_is_available() { return cuda::device_count() > 0; }
int cuda_device_count() { return cuda::device_count(); }

namespace {
IntVec row_major(const IntVec& sizes) {
  IntVec st(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return st;
}
}  // namespace

Tensor empty(const IntVec& sizes, DType dtype, Device device) {
  switch (device.type) {
    case DeviceType::CPU: return empty(sizes, dtype);
    case DeviceType::CUDA: break;
  }
  const int64_t nbytes = core::checked_nbytes(sizes, itemsize(dtype), "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(nbytes), device);
  impl->sizes = to_symint_vec(sizes);
  impl->strides = to_symint_vec(row_major(sizes));
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}
Tensor zeros(const IntVec& sizes, DType dtype, Device device) {
  if (device.type == DeviceType::CPU) return zeros(sizes, dtype);
  Tensor t = empty(sizes, dtype, device);
  cuda::memset_device(device.index, reinterpret_cast<cuda::CUdeviceptr>(t.impl()->storage->data()), 0,
                      t.impl()->storage->nbytes());
  return t;
}
Tensor full(const IntVec& sizes, double value, DType dtype, Device device) {
  Tensor h = full(to_symint_vec(sizes), value, dtype);
  return device.type == DeviceType::CPU ? h : h.to(device);
}
Tensor ones(const IntVec& sizes, DType dtype, Device device) { return full(sizes, 1.0, dtype, device); }
Tensor rand(const IntVec& sizes, DType dtype, Device device) {
  Tensor h = rand(sizes, dtype);
  return device.type == DeviceType::CPU ? h : h.to(device);
}
Tensor randn(const IntVec& sizes, DType dtype, Device device) {
  Tensor h = randn(sizes, dtype);
  return device.type == DeviceType::CPU ? h : h.to(device);
}

Tensor Tensor::cpu() const { return to(kCPU); }

Tensor Tensor::to(Device target) const {
  if (!defined()) throw ValueError("to(device): the tensor is undefined");
  if (is_fake())
    throw ValueError(fmt::format("to({}): moving a capture-time FakeTensor between devices is not supported inside a "
                                 "compiled function; move the inputs before the call",
                                 target.str()));
  const Device src = device();
  if (src == target) return *this;
  if (src.type == DeviceType::CPU) {
    // Host -> device: one contiguous host buffer, one copy.
    Tensor h = contiguous();
    Tensor d = empty(h.int_sizes(), dtype(), target);
    const size_t n = static_cast<size_t>(h.int_numel()) * itemsize();
    cuda::copy_host_to_device(target.index, reinterpret_cast<cuda::CUdeviceptr>(d.impl()->storage->data()),
                              n ? h.data_ptr() : nullptr, n);
    return d;
  }
  // Device -> host: copy the bytes the view spans, rebuild the view on the host, make it contiguous.
  const IntVec sz = int_sizes();
  const IntVec st = int_strides();
  const int64_t numel = int_numel();
  Tensor host;
  if (numel == 0) {
    host = empty(sz, dtype());
  } else {
    int64_t extent = core::checked_extent(sz, st, itemsize(), "to(cpu)");
    Tensor span = empty({extent}, dtype());
    const auto base = reinterpret_cast<cuda::CUdeviceptr>(impl()->storage->data()) +
                      static_cast<cuda::CUdeviceptr>(storage_offset().hint()) * itemsize();
    cuda::copy_device_to_host(src.index, span.data_ptr(), base, static_cast<size_t>(extent) * itemsize());
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = span.impl()->storage;
    impl->sizes = to_symint_vec(sz);
    impl->strides = to_symint_vec(st);
    impl->dtype = dtype();
    host = Tensor(std::move(impl)).contiguous();
  }
  return target.type == DeviceType::CPU ? host : host.to(target);
}

Tensor from_blob(void* data, const IntVec& sizes, DType dtype, const IntVec& strides,
                 std::function<void(void*)> deleter) {
  IntVec st = strides;
  if (st.empty()) {
    core::checked_nbytes(sizes, itemsize(dtype), "from_blob");
    st.resize(sizes.size());
    int64_t acc = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      st[i] = acc;
      acc *= std::max<int64_t>(sizes[i], 1);
    }
  }
  if (st.size() != sizes.size())
    throw ValueError(fmt::format("from_blob: {} sizes but {} strides", sizes.size(), st.size()));
  const int64_t extent = core::checked_extent(sizes, st, itemsize(dtype), "from_blob");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, static_cast<size_t>(extent) * itemsize(dtype), std::move(deleter));
  impl->sizes = to_symint_vec(sizes);
  impl->strides = to_symint_vec(st);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <typename T>
Tensor tensor(const std::vector<T>& values, const IntVec& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (n != static_cast<int64_t>(values.size()))
    throw ShapeError(fmt::format("tensor(): {} values do not fill shape {}", values.size(), to_string(to_symint_vec(sizes))));
  DType d;
  if constexpr (std::is_same_v<T, float>) d = DType::F32;
  else if constexpr (std::is_same_v<T, double>) d = DType::F64;
  else if constexpr (std::is_same_v<T, int64_t>) d = DType::I64;
  else if constexpr (std::is_same_v<T, int32_t>) d = DType::I32;
  else if constexpr (std::is_same_v<T, int8_t>) d = DType::I8;
  else if constexpr (std::is_same_v<T, uint8_t>) d = DType::U8;
  else d = DType::Bool;
  Tensor t = empty(sizes, d);
  T* p = t.data_ptr<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}
template Tensor tensor<float>(const std::vector<float>&, const IntVec&);
template Tensor tensor<double>(const std::vector<double>&, const IntVec&);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, const IntVec&);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, const IntVec&);
template Tensor tensor<int8_t>(const std::vector<int8_t>&, const IntVec&);
template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, const IntVec&);
template <>
Tensor tensor<bool>(const std::vector<bool>& values, const IntVec& sizes) {
  std::vector<uint8_t> v(values.begin(), values.end());
  Tensor t = tensor<uint8_t>(v, sizes);
  t.impl()->dtype = DType::Bool;
  return t;
}

namespace {
std::mutex g_rng_mu;
std::mt19937_64& rng() {
  static std::mt19937_64 g(0x5eed);
  return g;
}
template <typename Fill>
Tensor random_tensor(const char* what, const IntVec& sizes, DType dtype, Fill fill) {
  core::checked_nbytes(sizes, std::max(itemsize(dtype), itemsize(DType::F64)), what);
  Tensor f64 = empty(sizes, DType::F64);
  double* p = f64.data_ptr<double>();
  int64_t n = f64.int_numel();
  {
    std::lock_guard<std::mutex> lk(g_rng_mu);
    for (int64_t i = 0; i < n; ++i) p[i] = fill(rng());
  }
  return dtype == DType::F64 ? f64 : core::contiguous_copy(f64, dtype);
}
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lk(g_rng_mu);
  rng().seed(seed);
}
Tensor rand(const IntVec& sizes, DType dtype) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return random_tensor("rand", sizes, dtype, [&](std::mt19937_64& g) { return u(g); });
}
Tensor randn(const IntVec& sizes, DType dtype) {
  std::normal_distribution<double> nd(0.0, 1.0);
  return random_tensor("randn", sizes, dtype, [&](std::mt19937_64& g) { return nd(g); });
}
Tensor randint(int64_t low, int64_t high, const IntVec& sizes, DType dtype) {
  if (high <= low) throw ValueError(fmt::format("randint: empty range [{}, {})", low, high));
  std::uniform_int_distribution<int64_t> u(low, high - 1);
  return random_tensor("randint", sizes, dtype, [&](std::mt19937_64& g) { return static_cast<double>(u(g)); });
}

}  // namespace protean
