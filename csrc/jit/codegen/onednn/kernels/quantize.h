#pragma once
// llga::quantize_per_tensor(x, scale, zero_point, dtype): aten::quantize_per_tensor of a dense fp32
// tensor to u8 or s8 codes, bit for bit (quantize.cpp says how), on both threads with AVX-512. The
// QuantizeOwnKernel pass gives it the quantizes the fuser leaves to PyTorch: an int8 transformer's
// quantize of each layer norm's output (oneDNN's layer norm with an int8 output is its reference
// kernel: quirk layer_norm_quantized_output) and of the attention's output, a CNN's of its input.
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kQuantizePerTensor = c10::Symbol::fromQualString("llga::quantize_per_tensor");

// From this many values on the kernel is worth its call (below, PyTorch's loop is as quick).
constexpr int64_t kOwnQuantizeMinElements = 16 * 1024;

// Whether this CPU runs the kernel (AVX-512).
bool own_quantize_runs();

}  // namespace llga
