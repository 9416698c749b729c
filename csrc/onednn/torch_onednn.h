#pragma once
// torch_llga runs on the oneDNN built into PyTorch's own libtorch_cpu.so (v3.12 in torch 2.14), with
// the headers torch ships. That library keeps oneDNN's C API out of its exported symbols, so
// torch_onednn.cpp defines a hidden stub for each C API function the Graph API's C++ header calls
// and points it, when this library loads, at the function's address found in libtorch_cpu.so's
// symbol table. One oneDNN in the process (torch's), one OpenMP pool, nothing else to install.
#include <string>

namespace llga::onednn {

// Empty when every function resolved and the library's oneDNN is the one the headers describe;
// otherwise one sentence saying what was expected and what was found. Nothing may call oneDNN then:
// `import torch_llga` raises it, and the C++ library keeps the fuser off and prints it.
const std::string& load_error();

// The libtorch_cpu.so whose oneDNN is in use, and that oneDNN's version ("3.12.0").
const std::string& library_path();
std::string version();

// The instruction set oneDNN's CPU kernels use here (its dnnl_get_effective_cpu_isa: the CPU's,
// capped by ONEDNN_MAX_CPU_ISA), by name ("avx2", "avx512_core_bf16", ...), and what follows for
// the data types: whether its int8 kernels have VNNI (without it they add u8 x s8 products in
// saturating 16-bit pairs) and whether it has bf16 kernels at all.
struct Cpu {
  std::string isa;
  bool int8_vnni = false;
  bool bf16 = false;
};
const Cpu& cpu();

}  // namespace llga::onednn
