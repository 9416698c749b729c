#pragma once
// What PyTorch's ops of a fallback read (guard_runtime.cpp defines it).
#include <ATen/Tensor.h>
#include <ATen/core/jit_type.h>

namespace llga {

// For a fallback's PyTorch ops (a failed guard's, a kernel's own): t as eager would have it. A 4-D
// tensor a group handed over in channels-last strides (kChannelsLastOutput) where the profile saw
// NCHW is made NCHW again: PyTorch's ops pass the layout on, and a later view() expects eager's.
at::Tensor in_profiled_layout(const at::Tensor& t, const c10::TensorType& profiled);
}  // namespace llga
