#pragma once
// Quantized tensors over the buffer pool's memory (buffer_pool.h): the outputs of int8 groups and
// of the own int8 kernels, below the fuser so that kernels and runtime alike make them.
#include <ATen/Tensor.h>
#include <c10/core/MemoryFormat.h>

namespace llga {

// A new quantized output (per tensor, sizes in format), its memory from the buffer pool.
at::Tensor new_quantized_output(c10::IntArrayRef sizes, c10::ScalarType dtype, double scale, int64_t zero_point,
                                c10::MemoryFormat format);
// t's memory as a quantized tensor of t's sizes with this scale and zero point (an int8 residual
// the output is computed into).
at::Tensor quantized_output_in(const at::Tensor& t, double scale, int64_t zero_point, c10::MemoryFormat format);

}  // namespace llga
