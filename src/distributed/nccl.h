// NCCL as one table of function pointers, loaded at run time (like the CUDA driver, device/driver.h).
//
// Protean never links against NCCL: `nccl()` dlopen's libnccl.so.2 (or PROTEAN_NCCL_LIBRARY) on first
// use and resolves the few entry points the data-parallel step needs. Without it `nccl()` returns
// nullptr and `nccl_unavailable_reason()` says why, so builds and CPU runs never need NCCL. Tests
// install an in-process fake table with `set_nccl_for_testing`.
//
// Types are declared with nccl.h's layouts (NCCL 2.x ABI), so no NCCL header is needed to build.
#pragma once

#include <string>
#include <string_view>

#include "device/driver.h"
#include "protean/distributed.h"
#include "protean/dtype.h"

namespace protean::nccl {

using ncclResult_t = int;
struct ncclComm;
using ncclComm_t = ncclComm*;
/// nccl.h's NCCL_UNIQUE_ID_BYTES = 128.
struct ncclUniqueId {
  char internal[128];
};
using ncclDataType_t = int;
using ncclRedOp_t = int;

// nccl.h's enum values.
inline constexpr ncclResult_t kSuccess = 0;
inline constexpr ncclResult_t kInProgress = 7;
inline constexpr ncclDataType_t kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
                                 kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9;
inline constexpr ncclRedOp_t kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4;
/// ncclAvg and ncclBfloat16 arrived in NCCL 2.10 (ncclGetVersion's code 21000).
inline constexpr int kMinVersion = 21000;

/// The NCCL entry points Protean uses. A field is never null in a table `nccl()` returns.
struct NcclApi {
  const char* name = "";  ///< "libnccl.so.2" or "fake"
  ncclResult_t (*ncclGetVersion)(int* version) = nullptr;
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId* id) = nullptr;
  ncclResult_t (*ncclCommInitRank)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) = nullptr;
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm) = nullptr;
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm) = nullptr;
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm, ncclResult_t* async_error) = nullptr;
  ncclResult_t (*ncclAllReduce)(const void* send, void* recv, size_t count, ncclDataType_t dtype, ncclRedOp_t op,
                                ncclComm_t comm, cuda::CUstream stream) = nullptr;
  ncclResult_t (*ncclBroadcast)(const void* send, void* recv, size_t count, ncclDataType_t dtype, int root,
                                ncclComm_t comm, cuda::CUstream stream) = nullptr;
  const char* (*ncclGetErrorString)(ncclResult_t result) = nullptr;
};

/// The process's NCCL table: the installed test table if any, else libnccl.so.2 (or
/// PROTEAN_NCCL_LIBRARY) loaded on first call (at least kMinVersion). nullptr when there is none; then
/// nccl_unavailable_reason() says why. Thread-safe; the load is attempted once per process.
const NcclApi* nccl();
std::string nccl_unavailable_reason();
/// nccl(), or throws RuntimeError("<what> needs NCCL: NCCL not found (dlopen libnccl.so.2: ...); ...").
const NcclApi& require_nccl(std::string_view what);
/// Installs `api` (nullptr restores the real library).
void set_nccl_for_testing(const NcclApi* api);
/// Loads the real table from `path` instead (a missing file: nccl() is nullptr with dlopen's reason);
/// "" reloads from PROTEAN_NCCL_LIBRARY or libnccl.so.2 on next use. For tests of the loader.
void set_nccl_library_for_testing(const std::string& path);

/// Throws RuntimeError("<call> failed: ncclInternalError (<ncclGetErrorString text>)") unless success.
void check(const NcclApi& api, ncclResult_t r, std::string_view call);
/// The NCCL type of a dtype (Bool travels as uint8). Never fails: every DType has one.
ncclDataType_t data_type(DType t);
ncclRedOp_t red_op(distributed::ReduceOp op);

}  // namespace protean::nccl
