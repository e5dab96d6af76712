#include "backend/cpu/kernel_dump.h"

#include <fmt/format.h>
#include <unistd.h>

#include <xxhash.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ir/printer.h"
#include "observe/log.h"
#include "sym/printer.h"

namespace protean::backend::cpu {

namespace {
const std::string& dump_dir() {
  static const std::string dir = [] {
    const char* d = std::getenv("PROTEAN_KERNEL_DUMP_DIR");
    return std::string(d && *d ? d : "");
  }();
  return dir;
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename.
void write_atomically(const std::filesystem::path& path, const std::string& text) {
  static std::atomic<uint64_t> seq{0};
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp{}.{}", ::getpid(), seq++);
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f) throw std::runtime_error("write failed");
  }
  std::filesystem::rename(tmp, path);
}
}  // namespace

bool kernel_dump_enabled() { return !dump_dir().empty(); }

void dump_kernels(const ir::Graph& g, const std::vector<sym::Expr>& symbols, const std::string& prelude,
                  const std::string& kernels) {
  if (!kernel_dump_enabled()) return;
  // The IR text does not show constant data, but scalar constants are folded into kernels: the data
  // of every constant is part of the name.
  std::string key = ir::print(g);
  for (const sym::Expr& s : symbols) key += "\n" + (s ? sym::print(s) : std::string("?"));
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Constant && n.constant.defined()) {
      const Tensor c = n.constant.contiguous();
      key += fmt::format("\n{:016x}", XXH64(c.data_ptr(), static_cast<size_t>(c.int_numel()) * itemsize(c.dtype()), 0));
    }
  std::string name;
  for (char c : g.name) name += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
  if (name.empty()) name = "graph";
  if (name.size() > 64) name.resize(64);
  const std::filesystem::path dir(dump_dir());
  const std::filesystem::path path = dir / fmt::format("{}-{:016x}.cpp", name, XXH64(key.data(), key.size(), 0));
  try {
    std::filesystem::create_directories(dir);
    if (!std::filesystem::exists(dir / "prelude.h")) write_atomically(dir / "prelude.h", prelude);
    write_atomically(path, kernels);
  } catch (const std::exception& e) {
    observe::warn(fmt::format("PROTEAN_KERNEL_DUMP_DIR: cannot write {}: {}", path.string(), e.what()));
  }
}

}  // namespace protean::backend::cpu
