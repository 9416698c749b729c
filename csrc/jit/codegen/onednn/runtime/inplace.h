#pragma once
// When a fused output may be computed in an input's memory (inplace.cpp).
#include <ATen/core/ivalue.h>
#include <ATen/Tensor.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

namespace llga {

// Whether input t (from stack slot arg; guarded: a guard's output) may become output lt, computed
// in its memory: an LLGA tensor in lt's very layout that nothing but this call holds.
bool reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const dnnl::graph::logical_tensor& lt);

// The same for a dense tensor t (not an LLGA one) in lt's dtype, sizes and strides whose memory came
// from the buffer pool or the CPU allocator: an int8 model's residual input, which PyTorch's
// quantize also reads, so its group made it dense. t is then the output.
bool dense_reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const dnnl::graph::logical_tensor& lt);

// The same for a quantized output (a dense QTensor, sizes in format): t a per-tensor quantized
// tensor of that dtype and layout whose memory came from the buffer pool or the CPU allocator and
// that nothing but this call holds. Then quantized_output_in(t, ...) (onednn/pooled_qtensor.h) is
// the output, t's memory with the output's scale and zero point.
bool quantized_reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, c10::ScalarType dtype,
                                  c10::IntArrayRef sizes, c10::MemoryFormat format);
}  // namespace llga
