// The torch this library was compiled against: a string in its read-only data, which the Python
// package reads from the file before loading the library (torch_llga/_build.py), and a check at
// load that the running torch numbers its operator symbols the same (build_info.h).
#include "build_info.h"

#include <ATen/core/interned_strings.h>

#if __has_include("built_for_torch.h")
#include "built_for_torch.h"  // setup.py: torch.__version__ and torch.version.git_version
#else
#include <torch/headeronly/version.h>  // the CMake build for libtorch programs: the release only
#define TORCH_LLGA_BUILT_FOR_TORCH TORCH_VERSION
#define TORCH_LLGA_BUILT_FOR_TORCH_GIT "Unknown"
#endif

namespace llga {

// Kept by `used` although nothing refers to it; stripping leaves .rodata alone.
[[gnu::used]] extern const char kBuiltForTorch[] =
    "torch_llga built for torch " TORCH_LLGA_BUILT_FOR_TORCH " git " TORCH_LLGA_BUILT_FOR_TORCH_GIT ";";

namespace {

// Every symbol torch's headers name, with the number compiled in: a table, which GCC compiles in
// seconds (the same checks written out as 2,000 ifs in one function took it minutes).
struct CompiledSymbol {
  const char* name;
  c10::Symbol symbol;
};
#define ENTRY(ns, s) {#ns "::" #s, c10::ns::s},
constexpr CompiledSymbol kCompiledSymbols[] = {FORALL_NS_SYMBOLS(ENTRY)};
#undef ENTRY

}  // namespace

const std::string& torch_mismatch() {
  // Each compiled-in number against the running torch's own (about 2,000 hash lookups, once).
  static const std::string error = [] {
    size_t differ = 0;
    const char* first = nullptr;
    for (const CompiledSymbol& s : kCompiledSymbols)
      if (c10::Symbol::fromQualString(s.name) != s.symbol && !differ++) first = s.name;
    if (!differ) return std::string();
    return "torch_llga was built for torch " TORCH_LLGA_BUILT_FOR_TORCH " and the running torch numbers " +
           std::to_string(differ) + " of its operator symbols differently (" + first +
           ", ...): rebuild torch_llga against this torch";
  }();
  return error;
}

}  // namespace llga
