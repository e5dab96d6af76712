#include "cache/build_id.h"

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>

namespace protean::cache {

std::string code_build_id() {
  static const std::string id = [] {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&code_build_id), &info) || !info.dli_fbase) return std::string("-");
    struct Find {
      const void* base;
      std::string hex;
    } f{info.dli_fbase, {}};
    dl_iterate_phdr(
        [](dl_phdr_info* obj, size_t, void* arg) -> int {
          auto* f = static_cast<Find*>(arg);
          bool mine = false;
          for (int i = 0; i < obj->dlpi_phnum && !mine; ++i)
            mine = obj->dlpi_phdr[i].p_type == PT_LOAD &&
                   reinterpret_cast<const void*>(obj->dlpi_addr + obj->dlpi_phdr[i].p_vaddr - obj->dlpi_phdr[i].p_offset) == f->base;
          if (!mine) return 0;
          for (int i = 0; i < obj->dlpi_phnum; ++i) {
            if (obj->dlpi_phdr[i].p_type != PT_NOTE) continue;
            const char* p = reinterpret_cast<const char*>(obj->dlpi_addr + obj->dlpi_phdr[i].p_vaddr);
            const char* end = p + obj->dlpi_phdr[i].p_memsz;
            while (p + sizeof(ElfW(Nhdr)) <= end) {
              const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
              const char* name = p + sizeof(ElfW(Nhdr));
              const char* desc = name + ((n->n_namesz + 3) & ~3u);
              if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0 && desc + n->n_descsz <= end) {
                for (uint32_t k = 0; k < n->n_descsz; ++k) f->hex += fmt::format("{:02x}", static_cast<unsigned char>(desc[k]));
                return 1;
              }
              p = desc + ((n->n_descsz + 3) & ~3u);
            }
          }
          return 1;
        },
        &f);
    return f.hex.empty() ? std::string("-") : f.hex;
  }();
  return id;
}

}  // namespace protean::cache
