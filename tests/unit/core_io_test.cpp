// Tensor printing (PyTorch's format), .npy load/save, DLPack import/export.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/npy.h"
#include "protean/protean.h"

namespace pt = protean;
namespace fs = std::filesystem;
using pt::DType;
using pt::IntVec;
using pt::Tensor;

namespace {

Tensor iota_i64(int64_t n, const IntVec& sizes) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return pt::tensor<int64_t>(v, sizes);
}

}  // namespace

// ---- printing ---------------------------------------------------------------------------------------
TEST(CoreIo, PrintFloatsSharedWidth) {
  Tensor t = pt::tensor<float>({0.1234f, -1.0f, 2.5f, 3.0f}, {2, 2});
  EXPECT_EQ(t.str(), "tensor([[ 0.1234, -1.0000],\n        [ 2.5000,  3.0000]])");
  EXPECT_EQ(pt::tensor<float>({1, 2, 3}, {3}).str(), "tensor([1., 2., 3.])");
  EXPECT_EQ(pt::tensor<float>({-1, 20, 3}, {3}).str(), "tensor([-1., 20.,  3.])");
  EXPECT_EQ(pt::tensor<float>({1e-5f, 1.0f}, {2}).str(), "tensor([1.0000e-05, 1.0000e+00])");
  EXPECT_EQ(pt::tensor<double>({1.5, 2.0}, {2}).str(), "tensor([1.5000, 2.0000], dtype=torch.float64)");
  EXPECT_EQ(pt::scalar_tensor(2.5).str(), "tensor(2.5000)");
  EXPECT_EQ(pt::scalar_tensor(0.0).str(), "tensor(0.)");
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(pt::tensor<float>({1.5f, nan, -inf}, {3}).str(), "tensor([1.5000,    nan,   -inf])");
  EXPECT_EQ(pt::tensor<float>({1.5f}, {1}).to(DType::F16).str(), "tensor([1.5000], dtype=torch.float16)");
}

TEST(CoreIo, PrintIntegersAndBool) {
  EXPECT_EQ(pt::tensor<int64_t>({1, -20, 300}, {3}).str(), "tensor([  1, -20, 300])");
  EXPECT_EQ(pt::tensor<int32_t>({1, 2}, {2}).str(), "tensor([1, 2], dtype=torch.int32)");
  EXPECT_EQ(pt::tensor<uint8_t>({7}, {1}).str(), "tensor([7], dtype=torch.uint8)");
  EXPECT_EQ(pt::tensor<bool>({true, false}, {2}).str(), "tensor([ True, False])");
  EXPECT_EQ(pt::scalar_tensor(3, DType::I64).str(), "tensor(3)");
  EXPECT_EQ(pt::tensor<int64_t>({9007199254740993, -1}, {2}).str(), "tensor([9007199254740993,               -1])");
  EXPECT_EQ(iota_i64(8, {2, 2, 2}).str(), "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])");
}

TEST(CoreIo, PrintEmpty) {
  EXPECT_EQ(pt::zeros({0}).str(), "tensor([])");
  EXPECT_EQ(pt::zeros({0, 3}).str(), "tensor([], size=(0, 3))");
  EXPECT_EQ(pt::zeros({0}, DType::I64).str(), "tensor([], dtype=torch.int64)");
  EXPECT_EQ(pt::zeros({2, 0}, DType::F16).str(), "tensor([], size=(2, 0), dtype=torch.float16)");
}

TEST(CoreIo, PrintSummarizesAndWraps) {
  EXPECT_EQ(iota_i64(2000, {2000}).str(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  EXPECT_EQ(iota_i64(1100, {100, 11}).str(),
            "tensor([[   0,    1,    2,  ...,    8,    9,   10],\n"
            "        [  11,   12,   13,  ...,   19,   20,   21],\n"
            "        [  22,   23,   24,  ...,   30,   31,   32],\n"
            "        ...,\n"
            "        [1067, 1068, 1069,  ..., 1075, 1076, 1077],\n"
            "        [1078, 1079, 1080,  ..., 1086, 1087, 1088],\n"
            "        [1089, 1090, 1091,  ..., 1097, 1098, 1099]])");
  // 1000 elements exactly: not summarized
  EXPECT_EQ(iota_i64(1000, {1000}).str().find("..."), std::string::npos);
  // 20 floats of width 6: (80 - 7) / 8 = 9 per line
  std::vector<float> v(20, 0.5f);
  std::string s = pt::tensor<float>(v, {20}).str();
  std::string line = "0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000";
  EXPECT_EQ(s, "tensor([" + line + ",\n        " + line + ",\n        0.5000, 0.5000])");
  // non-contiguous views print in logical order
  Tensor t = pt::transpose(iota_i64(6, {2, 3}), 0, 1);
  EXPECT_EQ(t.str(), "tensor([[0, 3],\n        [1, 4],\n        [2, 5]])");
  std::ostringstream os;
  os << pt::tensor<int64_t>({5}, {1});
  EXPECT_EQ(os.str(), "tensor([5])");
}

// ---- .npy ---------------------------------------------------------------------------------------------
namespace {

struct TmpDir {
  fs::path p;
  TmpDir() {
    p = fs::temp_directory_path() / ("protean_io_test_" + std::to_string(::getpid()) + "_" +
                                     std::to_string(std::random_device{}()));
    fs::create_directories(p);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
  std::string file(const std::string& name) const { return (p / name).string(); }
};

std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string h = dict;
  size_t pre = major == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64) h.push_back(' ');
  h.push_back('\n');
  std::string out = std::string("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  if (major != 1) out.append(2, '\0');
  return out + h + data;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream o(path, std::ios::binary);
  o.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void expect_format_error(const std::string& path, const std::string& needle) {
  try {
    pt::load_npy(path);
    ADD_FAILURE() << "load_npy should fail for " << needle;
  } catch (const pt::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(CoreIo, NpyRoundTripEveryDType) {
  TmpDir dir;
  for (DType dt : {DType::F32, DType::F16, DType::F64, DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool}) {
    for (const IntVec& shape : {IntVec{2, 3}, IntVec{5}, IntVec{}, IntVec{0, 4}, IntVec{2, 1, 3}}) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      std::vector<double> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = dt == DType::Bool ? i % 2 : (i * 7 % 11) - (dt == DType::U8 ? 0 : 5);
      Tensor t = pt::tensor<double>(v, shape).to(dt);
      std::string path = dir.file("t.npy");
      pt::save_npy(path, t);
      Tensor u = pt::load_npy(path);
      EXPECT_EQ(u.dtype(), dt);
      EXPECT_EQ(u.int_sizes(), shape);
      EXPECT_EQ(u.to_vector<double>(), t.to_vector<double>()) << pt::short_name(dt);
    }
  }
  // non-contiguous input saves in logical order; no temporary files remain
  Tensor x = pt::transpose(pt::tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);
  pt::save_npy(dir.file("x.npy"), x);
  EXPECT_EQ(pt::load_npy(dir.file("x.npy")).to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.p)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2);
  // the header is what NumPy writes: v1.0, data 64-byte aligned
  std::ifstream f(dir.file("x.npy"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size() % 64, 24u % 64);  // 64-aligned header + 6 floats
  EXPECT_NE(bytes.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }"), std::string::npos);
  // bf16 has no NumPy dtype: its uint16 bit patterns ('<u2'), read back as bf16 by load_npy_for
  Tensor h = pt::tensor<float>({1.5f, -2.0f}, {2}).to(DType::BF16);
  pt::save_npy(dir.file("b.npy"), h);
  Tensor bits = pt::load_npy(dir.file("b.npy"));
  EXPECT_EQ(bits.dtype(), DType::I32);
  EXPECT_EQ(bits.to_vector<int64_t>(), (std::vector<int64_t>{0x3fc0, 0xc000}));
  Tensor back = pt::core::load_npy_for(dir.file("b.npy"), DType::BF16);
  EXPECT_EQ(back.dtype(), DType::BF16);
  EXPECT_EQ(back.to(DType::F32).to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(CoreIo, NpyWidensInt16AndUnsignedTypes) {
  TmpDir dir;
  std::string p = dir.file("w.npy");
  write_file(p, npy_bytes("{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }", raw<int16_t>({-32768, 7, 32767})));
  Tensor a = pt::load_npy(p);
  EXPECT_EQ(a.dtype(), DType::I32);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{-32768, 7, 32767}));
  write_file(p, npy_bytes("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", raw<uint16_t>({65535, 1})));
  EXPECT_EQ(pt::load_npy(p).to_vector<int64_t>(), (std::vector<int64_t>{65535, 1}));
  write_file(p, npy_bytes("{'descr': '<u4', 'fortran_order': True, 'shape': (2, 2), }",
                          raw<uint32_t>({4294967295u, 2, 3, 4})));
  Tensor c = pt::load_npy(p);
  EXPECT_EQ(c.dtype(), DType::I64);
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{4294967295LL, 3, 2, 4}));
  write_file(p, npy_bytes("{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }", raw<uint64_t>({1ULL << 40})));
  EXPECT_EQ(pt::load_npy(p).to_vector<int64_t>(), (std::vector<int64_t>{int64_t{1} << 40}));
  write_file(p, npy_bytes("{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }", raw<uint64_t>({1ULL << 63})));
  expect_format_error(p, "2^63");
  write_file(p, npy_bytes("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", raw<uint16_t>({1})));
  expect_format_error(p, "does not match");
}

TEST(CoreIo, NpyLoadsFortranOrderAndNewerVersions) {
  TmpDir dir;
  // [[1, 2, 3], [4, 5, 6]] in column-major order
  std::string p = dir.file("f.npy");
  write_file(p, npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                          raw<float>({1, 4, 2, 5, 3, 6})));
  Tensor t = pt::load_npy(p);
  EXPECT_EQ(t.int_sizes(), (IntVec{2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // 3-D Fortran, i64
  std::vector<int64_t> fv(24);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) fv[static_cast<size_t>(i + 2 * j + 6 * k)] = i * 12 + j * 4 + k;
  write_file(p, npy_bytes("{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3, 4), }", raw(fv)));
  std::vector<int64_t> want(24);
  for (int64_t i = 0; i < 24; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(pt::load_npy(p).to_vector<int64_t>(), want);
  // version 2.0 and 3.0 headers, '|b1', '|i1' spellings
  write_file(p, npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string("\1\0\1", 3), 2));
  EXPECT_EQ(pt::load_npy(p).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  write_file(p, npy_bytes("{\"descr\": \"|i1\", \"fortran_order\": False, \"shape\": (2,)}", std::string("\xff\x02", 2), 3));
  EXPECT_EQ(pt::load_npy(p).to_vector<int64_t>(), (std::vector<int64_t>{-1, 2}));
}

TEST(CoreIo, NpyCorruptFilesThrowFormatErrorNamingTheFile) {
  TmpDir dir;
  std::string good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", raw<float>({1, 2, 3, 4}));
  std::string p = dir.file("bad.npy");
  write_file(p, "PK\3\4 this is a zip file, not npy");
  expect_format_error(p, "magic");
  write_file(p, good.substr(0, 40));
  expect_format_error(p, "truncated");
  write_file(p, good.substr(0, 6));
  expect_format_error(p, "truncated");
  write_file(p, good.substr(0, good.size() - 4));
  expect_format_error(p, "does not match");
  write_file(p, good + "xxxx");
  expect_format_error(p, "does not match");
  write_file(p, npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", raw<float>({1})));
  expect_format_error(p, "big-endian");
  write_file(p, npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')));
  expect_format_error(p, "unsupported dtype");
  write_file(p, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw<float>({1, 2})));
  expect_format_error(p, "shape");
  write_file(p, npy_bytes("{'descr': '<f4', 'shape': (1,), }", raw<float>({1})));
  expect_format_error(p, "fortran_order");
  std::string v9 = good;
  v9[6] = 9;
  write_file(p, v9);
  expect_format_error(p, "version");
  EXPECT_THROW(pt::load_npy(dir.file("missing.npy")), pt::RuntimeError);
  std::filesystem::create_directories(dir.file("a_dir.npy"));
  try {
    pt::load_npy(dir.file("a_dir.npy"));
    ADD_FAILURE() << "no error for a directory";
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("a_dir.npy': it is a directory"), std::string::npos) << e.what();
  }
}

// ---- DLPack -------------------------------------------------------------------------------------------
namespace {
int g_deleter_calls = 0;
struct Producer {
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {1, 2};  // column-major view of data
  DLManagedTensor m{};
};
void producer_deleter(DLManagedTensor* self) {
  ++g_deleter_calls;
  delete static_cast<Producer*>(self->manager_ctx);
}
Producer* make_producer() {
  auto* p = new Producer;
  p->m.dl_tensor.data = p->data.data();
  p->m.dl_tensor.device = {kDLCPU, 0};
  p->m.dl_tensor.ndim = 2;
  p->m.dl_tensor.dtype = {kDLFloat, 32, 1};
  p->m.dl_tensor.shape = p->shape;
  p->m.dl_tensor.strides = p->strides;
  p->m.dl_tensor.byte_offset = 0;
  p->m.manager_ctx = p;
  p->m.deleter = producer_deleter;
  return p;
}
}  // namespace

TEST(CoreIo, DlpackImportIsZeroCopyAndCallsDeleterOnce) {
  g_deleter_calls = 0;
  Producer* p = make_producer();
  float* raw_ptr = p->data.data();
  {
    Tensor t = pt::from_dlpack(&p->m);
    EXPECT_EQ(t.data_ptr<float>(), raw_ptr);
    EXPECT_EQ(t.int_sizes(), (IntVec{2, 3}));
    EXPECT_EQ(t.int_strides(), (IntVec{1, 2}));
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 3, 5, 2, 4, 6}));
    Tensor view = pt::select(t, 0, 1);
    t = Tensor();
    EXPECT_EQ(g_deleter_calls, 0);  // a view still holds the storage
    raw_ptr[1] = 42;
    EXPECT_EQ(view.to_vector<float>()[0], 42.f);
  }
  EXPECT_EQ(g_deleter_calls, 1);
}

TEST(CoreIo, DlpackExportRoundTripKeepsStorageAlive) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32, DType::I8, DType::U8,
                   DType::Bool}) {
    Tensor base = pt::tensor<double>({0, 1, 0, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}).to(dt);
    Tensor v = pt::slice(pt::transpose(base, 0, 1), 0, 1, 3);  // [2, 3], offset 1, strides [1, 4]
    std::vector<double> want = v.to_vector<double>();
    void* ptr = v.data_ptr();
    DLManagedTensor* m = v.to_dlpack();
    base = Tensor();
    v = Tensor();  // the managed tensor alone keeps the storage alive
    EXPECT_EQ(m->dl_tensor.data, ptr);
    EXPECT_EQ(m->dl_tensor.ndim, 2);
    EXPECT_EQ(m->dl_tensor.strides[0], 1);
    EXPECT_EQ(m->dl_tensor.strides[1], 4);
    EXPECT_EQ(m->dl_tensor.dtype.bits, pt::itemsize(dt) * 8);
    EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
    Tensor back = pt::from_dlpack(m);  // takes ownership: m's deleter runs when `back` goes
    EXPECT_EQ(back.data_ptr(), ptr);
    EXPECT_EQ(back.dtype(), dt);
    EXPECT_EQ(back.to_vector<double>(), want) << pt::short_name(dt);
  }
}

TEST(CoreIo, DlpackRejectsWithoutTakingOwnership) {
  g_deleter_calls = 0;
  Producer* p = make_producer();
  p->m.dl_tensor.device = {kDLOpenCL, 0};  // CPU and CUDA are accepted; other devices are not
  EXPECT_THROW(pt::from_dlpack(&p->m), pt::FormatError);
  p->m.dl_tensor.device = {kDLCPU, 0};
  p->m.dl_tensor.dtype = {kDLFloat, 32, 4};
  try {
    pt::from_dlpack(&p->m);
    ADD_FAILURE();
  } catch (const pt::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("lanes"), std::string::npos);
  }
  p->m.dl_tensor.dtype = {kDLComplex, 64, 1};
  EXPECT_THROW(pt::from_dlpack(&p->m), pt::FormatError);
  p->m.dl_tensor.dtype = {kDLUInt, 16, 1};
  EXPECT_THROW(pt::from_dlpack(&p->m), pt::FormatError);
  EXPECT_EQ(g_deleter_calls, 0);
  p->m.deleter(&p->m);
  EXPECT_EQ(g_deleter_calls, 1);
  EXPECT_THROW(pt::from_dlpack(nullptr), pt::ValueError);
}
