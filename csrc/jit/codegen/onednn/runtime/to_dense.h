#pragma once
// LLGA tensors to strided ones, for the ops PyTorch runs (a guard's or kernel's fallback, a
// matmul input oneDNN would misread): a oneDNN Reorder compiled once per source layout.
#include <ATen/Tensor.h>

namespace llga {

// A strided, contiguous copy of an LLGA tensor (a oneDNN reorder); other tensors pass through.
at::Tensor llga_to_dense(const at::Tensor& t);

}  // namespace llga
