#pragma once
// What this CPU can run, asked in one place. Two questions with two answers:
// - CpuFeatures (here): the instruction sets torch_llga's own kernels (kernels/) need, read from
//   the CPU itself once. An own kernel, and the pass that would put it in a graph, ask this.
// - onednn::cpu() (torch_onednn.h): what oneDNN's kernels do here, its effective ISA (capped by
//   ONEDNN_MAX_CPU_ISA), and what follows: bf16 kernels, VNNI for int8. The op table and the
//   passes that decide what oneDNN gets ask that.
// Loops compiled for several ISAs ([[gnu::target_clones(...)]]: the guards' NaN scan, the small
// plan's loops) are picked by the loader and ask neither.
namespace llga {

struct CpuFeatures {
  bool avx2_fma = false;     // every own fp32 kernel
  bool avx512 = false;       // AVX-512 F, BW and VL: the int8 pools and quantize
  bool avx512_bf16 = false;  // AVX512_BF16 (with F, BW, VL): the bf16 head64 attention kernel
  bool amx_bf16 = false;     // AMX tiles for bf16: oneDNN's kernels are faster there than the bf16 kernel
};

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    c.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
    c.amx_bf16 = __builtin_cpu_supports("amx-bf16");
    return c;
  }();
  return f;
}

}  // namespace llga
