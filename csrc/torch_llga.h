#pragma once
// torch_llga's C++ API for libtorch programs: link TorchLLGA::torch_llga (find_package(TorchLLGA)).
// Loading the library registers the fuser with TorchScript's executor; it fuses the graphs the
// executor optimizes while it is enabled. TORCH_LLGA_ENABLE=1 in the environment enables it when
// the library loads, so a program that links or preloads it gains fusion without code changes.
#define TORCH_LLGA_API __attribute__((visibility("default")))

namespace torch_llga {

TORCH_LLGA_API void enable();
TORCH_LLGA_API void disable();
TORCH_LLGA_API bool is_enabled();

}  // namespace torch_llga
