// The own-kernel table: one row per kernel of torch_llga's own (kernels/) or other way of running
// ops that the fuser would otherwise hand to oneDNN Graph, what it takes, and the phase of the
// pipeline that applies it. Where an own kernel and PyTorch's op both run the ops, which one
// runs is measured on the machine at hand (its choice site, settings/choices.h); a row without one
// is a rule (a kernel that avoids a wrong answer, or one nothing else runs as well).
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

const std::vector<OwnKernelRow>& own_kernel_table() {
  static const std::vector<OwnKernelRow> table = {
      {"decode_attention", "llga::decode_attention",
       "scaled_dot_product_attention of a decoder's 1-8 queries over its KV cache (heads of 64 or 128), grouped heads read in place",
       "fp32 bf16", "AVX2 FMA", "decode_attention", OwnPhase::kEarly, DecodeAttention},
      {"small_head_attention", "llga::small_head_attention", "attention of 8- or 16-wide heads over 512+ keys (DecomposeOps' SDPA)",
       "fp32", "AVX2 FMA", "small_head_attention", OwnPhase::kInsidePass, nullptr},
      {"head64_attention", "llga::head64_attention", "attention of 64-wide heads, 96+ queries over 128+ keys (DecomposeOps' SDPA)",
       "fp32 bf16", "AVX2 FMA (bf16: AVX512_BF16, no AMX)", "head64_attention", OwnPhase::kInsidePass, nullptr},
      {"long_attention", "llga::long_attention",
       "unmasked fp32 attention over 1,024+ keys that no kernel above takes: PyTorch's flash kernel or oneDNN's SDPA (DecomposeOps' SDPA)",
       "fp32", "any", "long_attention", OwnPhase::kInsidePass, nullptr},
      {"requantize", "llga::requantize", "int8 codes to another scale across a reshape (PT2E's flatten; PrepareQuantization)",
       "int8", "any", "", OwnPhase::kInsidePass, nullptr},
      {"row_linear", "llga::row_linear", "linear of 1-4 rows over a constant weight of 64K+ values (a decoder's step)",
       "fp32 bf16", "AVX2 FMA", "row_linear", OwnPhase::kBeforeFuser, RowLinears},
      {"rms_norm_row_linear", "llga::rms_norm_row_linear", "RMSNorm and the linear of 1-4 rows that alone reads it (row_linear's rewrite)",
       "fp32 bf16", "AVX2 FMA", "rms_norm_row_linear", OwnPhase::kInsidePass, nullptr},
      {"int8_linear_as_convolution", "oneDNN 1x1 int8 convolution",
       "int8 linear of 1-16 rows whose output no mapped op reads (a classifier's head)", "int8", "no VNNI", "",
       OwnPhase::kBeforeFuser, Int8LinearsAsConvolutions},
      {"widened_linear", "llga::widened_linear", "bf16 linear over a constant weight, as fp32 GEMMs on weight blocks widened in turn",
       "bf16", "no oneDNN bf16 kernels", "widened_linear", OwnPhase::kBeforeFuser, WidenBf16Linears},
      {"layer_norm", "llga::layer_norm", "layer norm over the last dim whose output a quantize reads", "fp32", "AVX2 FMA", "layer_norm",
       OwnPhase::kBeforeFuser, LayerNormOwnKernel},
      {"quantized_global_avg_pool", "llga::quantized_global_avg_pool", "int8 global average pool, codes out (a CNN's before its classifier)",
       "int8", "AVX-512 F BW VL", "quantized_pool", OwnPhase::kBeforeFuser, QuantizedPoolOwnKernel},
      {"quantized_max_pool2d", "llga::quantized_max_pool2d", "int8 max pool on its input's grid (quantized_pool's rewrite)", "int8",
       "AVX-512 F BW VL", "quantized_pool", OwnPhase::kInsidePass, nullptr},
      {"quantize_per_tensor", "llga::quantize_per_tensor", "fp32 -> int8 quantize the fuser left to PyTorch, 16K+ values", "fp32",
       "AVX-512 F", "quantize_per_tensor", OwnPhase::kAfterGuards, QuantizeOwnKernel},
  };
  return table;
}

namespace {

void apply_phase(std::shared_ptr<Graph>& g, OwnPhase phase) {
  if (!runtime::own_kernels_enabled()) return;
  for (const OwnKernelRow& row : own_kernel_table()) {
    if (row.phase != phase || !row.apply) continue;
    if (runtime::switched_off(row.name)) {
      GRAPH_DEBUG("Own kernel ", row.name, " switched off");
      continue;
    }
    row.apply(g);
  }
}

}  // namespace

void OwnKernelsEarly(std::shared_ptr<Graph>& g) { apply_phase(g, OwnPhase::kEarly); }
void OwnKernelsBeforeFuser(std::shared_ptr<Graph>& g) { apply_phase(g, OwnPhase::kBeforeFuser); }
void OwnKernelsAfterGuards(std::shared_ptr<Graph>& g) { apply_phase(g, OwnPhase::kAfterGuards); }

}  // namespace llga
