// Binds oneDNN's C API to the copy of oneDNN inside the loaded libtorch_cpu.so (see torch_onednn.h).
//
// Each function gets a hidden x86-64 stub, `jmp *slot(%rip)`, whose slot is filled when this library
// loads: the loaded libtorch_cpu.so's address plus the function's value in the file's .symtab (the
// functions are there as local symbols). Checks, each failing with one sentence: libtorch_cpu.so is
// loaded, the file read is the one loaded (same GNU build id), it has a symbol table, it holds every
// function exactly once, and its oneDNN has the headers' version and GNU OpenMP.
#include "onednn/torch_onednn.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_common.h>
#include <oneapi/dnnl/dnnl_config.h>
#include <oneapi/dnnl/dnnl_version.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#if !defined(__x86_64__)
#error "torch_llga's oneDNN stubs are x86-64 assembly"
#endif

namespace {
[[noreturn]] void unresolved();
}

// One pointer slot per function, first aimed at unresolved(). (In a linkage block, not `extern "C"
// void* x = ...`: that form is an extern declaration with an initializer, which GCC warns about.)
extern "C" {
#define X(name) __attribute__((visibility("hidden"))) void* llga_slot_##name = (void*)&unresolved;
#include "onednn_functions.inc"
#undef X
}

// The stubs: each C API name, defined hidden here, jumps through its slot (arguments untouched).
#define X(name)                                                                  \
  ".globl " #name "\n.hidden " #name "\n.type " #name ",@function\n" #name ":\n" \
  "\tjmp *llga_slot_" #name "(%rip)\n.size " #name ", .-" #name "\n"
__asm__(".text\n"
#include "onednn_functions.inc"
);
#undef X

namespace llga::onednn {
namespace {

struct Function {
  const char* name;
  void** slot;
};
const std::vector<Function>& functions() {
#define X(name) {#name, &llga_slot_##name},
  static const std::vector<Function> all = {
#include "onednn_functions.inc"
  };
#undef X
  return all;
}

// Function-local, so the load-time constructor below may fill them before other static objects exist.
std::string& error_storage() { static std::string s; return s; }
std::string& path_storage() { static std::string s; return s; }

struct Loaded {
  std::string path;
  ElfW(Addr) base = 0;
  std::string build_id;  // from the loaded image's PT_NOTE segments
};

std::string build_id_in_notes(const char* p, size_t size) {
  size_t off = 0;
  while (off + sizeof(ElfW(Nhdr)) <= size) {
    const auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p + off);
    size_t name_at = off + sizeof(ElfW(Nhdr)), desc_at = name_at + ((nh->n_namesz + 3) & ~size_t(3));
    if (desc_at + nh->n_descsz > size) break;
    if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(p + name_at, "GNU", 4) == 0)
      return std::string(p + desc_at, nh->n_descsz);
    off = desc_at + ((nh->n_descsz + 3) & ~size_t(3));
  }
  return "";
}

int find_torch_cpu(struct dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name ? info->dlpi_name : "";
  const char* base = std::strrchr(name, '/');
  if (std::strncmp(base ? base + 1 : name, "libtorch_cpu.so", 15) != 0) return 0;
  auto* found = static_cast<Loaded*>(data);
  found->path = name;
  found->base = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum && found->build_id.empty(); ++i)
    if (info->dlpi_phdr[i].p_type == PT_NOTE)
      found->build_id = build_id_in_notes(reinterpret_cast<const char*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr),
                                          info->dlpi_phdr[i].p_memsz);
  return 1;
}

// A read-only mapping of a whole file.
struct MappedFile {
  const char* data = nullptr;
  size_t size = 0;
  explicit MappedFile(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st{};
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
      void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p != MAP_FAILED) data = static_cast<const char*>(p), size = st.st_size;
    }
    close(fd);
  }
  ~MappedFile() { if (data) munmap(const_cast<char*>(data), size); }
  bool contains(size_t offset, size_t length) const { return offset <= size && length <= size - offset; }
};

std::string header_version() {
  return std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR) + "." + std::to_string(DNNL_VERSION_PATCH);
}

const char* const kRebuild = "rebuild torch_llga against the installed torch (make build, or pip install --no-build-isolation .)";

// The function addresses, or the sentence saying why there are none.
std::string resolve(std::vector<void*>& addresses) {
  Loaded loaded;
  dl_iterate_phdr(find_torch_cpu, &loaded);
  if (loaded.path.empty())
    return "torch_llga uses the oneDNN inside PyTorch's libtorch_cpu.so, which is not loaded in this process "
           "(import torch before torch_llga)";
  // TORCH_LLGA_TORCH_CPU_SYMBOLS: read the symbols from another copy of the same build (an unstripped one).
  const char* other = std::getenv("TORCH_LLGA_TORCH_CPU_SYMBOLS");
  std::string path = other && *other ? other : loaded.path;
  path_storage() = loaded.path;
  MappedFile file(path);
  if (!file.data) return "torch_llga cannot read " + path + " to find oneDNN's functions in it";
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(file.data);
  if (file.size < sizeof(*eh) || std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      !file.contains(eh->e_shoff, size_t(eh->e_shnum) * sizeof(ElfW(Shdr))))
    return "torch_llga expected an ELF shared library at " + path + " and found something else";
  const auto* sh = reinterpret_cast<const ElfW(Shdr)*>(file.data + eh->e_shoff);
  const ElfW(Shdr)* symtab = nullptr;
  std::string file_build_id;
  for (int s = 0; s < eh->e_shnum; ++s) {
    if (sh[s].sh_type == SHT_SYMTAB) symtab = &sh[s];
    if (sh[s].sh_type == SHT_NOTE && file_build_id.empty() && file.contains(sh[s].sh_offset, sh[s].sh_size))
      file_build_id = build_id_in_notes(file.data + sh[s].sh_offset, sh[s].sh_size);
  }
  if (file_build_id != loaded.build_id)
    return "torch_llga read oneDNN's symbols from " + path + ", which is not the build of libtorch_cpu.so loaded from " +
           loaded.path + " (their GNU build ids differ)";
  if (!symtab || symtab->sh_link >= eh->e_shnum)
    return "torch_llga needs the symbol table of PyTorch's libtorch_cpu.so to reach the oneDNN inside it, and " + path +
           " has none (a stripped build of torch): use torch from PyPI or download.pytorch.org, or point "
           "TORCH_LLGA_TORCH_CPU_SYMBOLS at an unstripped copy of the same build";
  const ElfW(Shdr)& strtab = sh[symtab->sh_link];
  if (!file.contains(symtab->sh_offset, symtab->sh_size) || !file.contains(strtab.sh_offset, strtab.sh_size))
    return "torch_llga found a truncated symbol table in " + path;

  const auto& fns = functions();
  std::unordered_map<std::string_view, size_t> wanted;
  for (size_t i = 0; i < fns.size(); ++i) wanted.emplace(fns[i].name, i);
  std::vector<ElfW(Addr)> value(fns.size(), 0);
  const auto* syms = reinterpret_cast<const ElfW(Sym)*>(file.data + symtab->sh_offset);
  const char* names = file.data + strtab.sh_offset;
  for (size_t k = 0, n = symtab->sh_size / sizeof(ElfW(Sym)); k < n; ++k) {
    const ElfW(Sym)& sym = syms[k];
    if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_name >= strtab.sh_size) continue;
    const char* name = names + sym.st_name;
    if (name[0] != 'd' || std::strncmp(name, "dnnl_", 5) != 0) continue;
    auto it = wanted.find(name);
    if (it == wanted.end()) continue;
    if (value[it->second] && value[it->second] != sym.st_value)
      return "torch_llga found oneDNN's " + std::string(name) + " twice in " + path + " and cannot tell which is oneDNN's";
    value[it->second] = sym.st_value;
  }
  std::string missing;
  size_t n_missing = 0;
  for (size_t i = 0; i < fns.size(); ++i)
    if (!value[i] && n_missing++ < 3) missing += std::string(missing.empty() ? "" : ", ") + fns[i].name;
  if (n_missing) {
    // Name the oneDNN that is there (dnnl_version exists in every release): an older one lacks
    // functions of a newer one's headers; a torch built without the Graph API lacks all of them.
    std::string found = "a oneDNN";
    auto at = wanted.find("dnnl_version");
    if (at != wanted.end() && value[at->second]) {
      using VersionFn = const dnnl_version_t* (*)();
      const dnnl_version_t* v = reinterpret_cast<VersionFn>(loaded.base + value[at->second])();
      found = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    }
    return "torch_llga was built for oneDNN " + header_version() + " and " + path + " holds " + found + " lacking " +
           std::to_string(n_missing) + " of the " + std::to_string(fns.size()) + " functions it uses (" + missing +
           (n_missing > 3 ? ", ..." : "") + "; a torch built without oneDNN Graph lacks them all): " + kRebuild;
  }
  addresses.resize(fns.size());
  for (size_t i = 0; i < fns.size(); ++i) addresses[i] = reinterpret_cast<void*>(loaded.base + value[i]);
  return "";
}

// Runs when this library loads, before its other static initializers (priority 101).
__attribute__((constructor(101))) void bind_at_load() {
  std::vector<void*> addresses;
  std::string error = resolve(addresses);
  if (error.empty()) {
    const auto& fns = functions();
    for (size_t i = 0; i < fns.size(); ++i) *fns[i].slot = addresses[i];
    const dnnl_version_t* v = dnnl_version();
    bool same = v->major == DNNL_VERSION_MAJOR && v->minor == DNNL_VERSION_MINOR && v->patch == DNNL_VERSION_PATCH;
    if (!same || v->cpu_runtime != DNNL_RUNTIME_OMP) {
      error = "torch_llga was built for oneDNN " + header_version() + " with OpenMP and " + path_storage() +
              " holds oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
              std::to_string(v->patch) + (v->cpu_runtime == DNNL_RUNTIME_OMP ? "" : " without OpenMP") + ": " + kRebuild;
      for (const auto& f : fns) *f.slot = reinterpret_cast<void*>(&unresolved);
    }
  }
  error_storage() = error;
}

}  // namespace

const std::string& load_error() { return error_storage(); }
const std::string& library_path() { return path_storage(); }

std::string version() {
  if (!load_error().empty()) return "";
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

const Cpu& cpu() {
  static const Cpu cpu = [] {
    Cpu c;
    if (!load_error().empty()) return c;
    // The ISA values are nested bit sets: each includes the bits of those it extends.
    auto has = [isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa())](dnnl_cpu_isa_t want) {
      return want != dnnl_cpu_isa_default && (isa & want) == static_cast<unsigned>(want);
    };
    const std::pair<dnnl_cpu_isa_t, const char*> names[] = {
        {dnnl_cpu_isa_avx10_1_512_amx_fp16, "avx512_core_amx_fp16"}, {dnnl_cpu_isa_avx10_1_512_amx, "avx512_core_amx"},
        {dnnl_cpu_isa_avx10_1_512, "avx512_core_fp16"}, {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
        {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"}, {dnnl_cpu_isa_avx512_core, "avx512_core"},
        {dnnl_cpu_isa_avx2_vnni_2, "avx2_vnni_2"}, {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"}, {dnnl_cpu_isa_avx2, "avx2"},
        {dnnl_cpu_isa_avx, "avx"}, {dnnl_cpu_isa_sse41, "sse41"}};
    c.isa = "default";
    for (const auto& [isa, name] : names)
      if (has(isa)) { c.isa = name; break; }
    c.int8_vnni = has(dnnl_cpu_isa_avx2_vnni) || has(dnnl_cpu_isa_avx512_core_vnni);
    // bf16: AVX-512 (native or emulated) or AVX2 with VNNI-2's bf16 conversions.
    c.bf16 = has(dnnl_cpu_isa_avx512_core) || has(dnnl_cpu_isa_avx2_vnni_2);
    return c;
  }();
  return cpu;
}

}  // namespace llga::onednn

namespace {
// Reached only if something calls oneDNN although load_error() said it must not.
[[noreturn]] void unresolved() {
  std::fprintf(stderr, "torch_llga: a oneDNN function was called without oneDNN: %s\n", llga::onednn::load_error().c_str());
  std::abort();
}
}  // namespace
