#pragma once
// The runtime operators the spelled-out attention (decompose_ops.cpp's SDPA) is written with, in
// their unfused form: what runs where a group falls back, and what the op table maps.
//   llga::softmax_inf_as_zero(x, dim): softmax, but 0 for rows of only -inf (oneDNN's SoftMax
//     "inf_as_zero" mode; PyTorch's SDPA gives a fully masked row 0).
//   llga::attention_bias(mask, like): a boolean mask as the bias PyTorch's SDPA adds (0 where True,
//     -inf where False), in like's dtype.
//   llga::sdpa_scale(q, scale): SDPA's scale (the given one, or 1 / sqrt(q.size(-1))) as a tensor of
//     q's dtype, of sdpa_scale_sizes().
#include <ATen/Tensor.h>

namespace llga {

at::Tensor attention_bias(const at::Tensor& mask, c10::ScalarType dtype);

// [1, 1, 1, 1] where the quirk sdpa_scale_4d is on (oneDNN 3.12 compiles no SDPA with a 1-D
// scale), else [1].
c10::IntArrayRef sdpa_scale_sizes();

}  // namespace llga
