#pragma once
// The JIT operator of an own kernel that takes a tensor and an output grid, "llga::<name>(Tensor x,
// float scale, int zero_point, ScalarType dtype) -> Tensor" (quantize.cpp, quantized_pool.cpp,
// requantize.cpp): its arguments popped off the stack, its result pushed.
#include <ATen/Tensor.h>
#include <ATen/record_function.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <string>

namespace llga {

using QuantizingKernel = at::Tensor (*)(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype);

template <QuantizingKernel kKernel>
torch::jit::Operator quantizing_operator(const std::string& name) {
  return torch::jit::Operator(
      "llga::" + name + "(Tensor x, float scale, int zero_point, ScalarType dtype) -> Tensor",
      [event = "llga::" + name](torch::jit::Stack& stack) {
        RECORD_FUNCTION(event, c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
        auto dtype = static_cast<c10::ScalarType>(torch::jit::pop(stack).toInt());
        int64_t zero_point = torch::jit::pop(stack).toInt();
        double scale = torch::jit::pop(stack).toDouble();
        at::Tensor x = torch::jit::pop(stack).toTensor();
        torch::jit::push(stack, kKernel(x, scale, zero_point, dtype));
      },
      c10::AliasAnalysisKind::FROM_SCHEMA);
}

}  // namespace llga
