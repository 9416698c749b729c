#pragma once
// LLGA tensors to strided ones, for the ops PyTorch runs (a guard's or kernel's fallback, a
// matmul input oneDNN would misread): a oneDNN Reorder compiled once per source layout.
#include <ATen/Tensor.h>

namespace llga {

// A strided, contiguous copy of an LLGA tensor (a oneDNN reorder); other tensors pass through.
at::Tensor llga_to_dense(const at::Tensor& t);

// A copy of a strided (not LLGA) tensor in other strides, by a oneDNN reorder: several times faster
// than PyTorch's copy across a permutation (4 MB to channels-last 3-D: 3.5 ms in PyTorch).
at::Tensor strided_copy(const at::Tensor& t, c10::IntArrayRef strides);

}  // namespace llga
