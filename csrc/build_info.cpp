// The torch this library was compiled against, as one string in its read-only data. The Python
// package reads it from the file before loading the library (torch_llga/_build.py): a torch of
// another release numbers its aten symbols differently and exports other C++ symbols, so loading
// this library into it would match the wrong ops or fail with a loader error.
#if __has_include("build_info.h")
#include "build_info.h"  // setup.py: torch.__version__ and torch.version.git_version
#else
#include <torch/headeronly/version.h>  // the CMake build for libtorch programs: the release only
#define TORCH_LLGA_BUILT_FOR_TORCH TORCH_VERSION
#define TORCH_LLGA_BUILT_FOR_TORCH_GIT "Unknown"
#endif

namespace llga {
// Kept by `used` although nothing refers to it; stripping leaves .rodata alone.
[[gnu::used]] extern const char kBuiltForTorch[] =
    "torch_llga built for torch " TORCH_LLGA_BUILT_FOR_TORCH " git " TORCH_LLGA_BUILT_FOR_TORCH_GIT ";";
}  // namespace llga
