#pragma once
// llga::widened_linear(x, weight, bias): a bf16 linear on a CPU where oneDNN has no bf16 kernels
// (AVX2 without AVX-VNNI-2, say), computed as fp32 on the weight widened a block at a time and
// rounded to bf16 once, as eager's bf16 linear rounds its fp32 sums; eager's own bf16 matmul there
// is a plain loop ~10x slower (widened_linear.cpp). The WidenBf16Linears pass gives it such linears
// over constant weights; anything else it is handed is at::linear.
#include <ATen/core/Tensor.h>
#include <ATen/core/symbol.h>

#include <optional>

namespace llga {

inline const c10::Symbol kWidenedLinear = c10::Symbol::fromQualString("llga::widened_linear");

// Whether bf16 linears are widened on this CPU (oneDNN has no bf16 kernels).
bool widened_linear_runs();

// x @ weight^T + bias: widened where widened_linear_runs() and all three are bf16 CPU tensors; else at::linear.
at::Tensor widened_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace llga
