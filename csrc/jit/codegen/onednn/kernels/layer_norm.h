#pragma once
// llga::layer_norm(x, normalized_shape, weight, bias, eps): aten::layer_norm of a dense fp32 tensor
// over its last dim, on both threads with AVX2 + FMA. The LayerNormOwnKernel pass gives it the
// layer norms of int8 transformers, whose output a quantize reads: oneDNN runs such a layer norm
// alone (its int8 output takes the reference kernel: quirk layer_norm_quantized_output), and a
// partition of one op costs more around it than the normalization itself.
#include <ATen/core/symbol.h>

namespace llga {

inline const c10::Symbol kLayerNorm = c10::Symbol::fromQualString("llga::layer_norm");

// Whether this CPU runs the kernel (AVX2 + FMA).
bool own_layer_norm_runs();

}  // namespace llga
