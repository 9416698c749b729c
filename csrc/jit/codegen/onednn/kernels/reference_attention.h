#pragma once
// PyTorch's attention, which every own attention kernel (small_head_attention, decode_attention,
// head64_attention) runs for the calls it does not take (sizes, dtypes, a NaN, an overflow): one
// definition, so the three answer such calls alike.
#include <ATen/ATen.h>

#include <optional>

namespace llga {

// The output as PyTorch's kernel gives it (kAsPyTorch); or, for a kernel whose graph was typed with
// its own output's strides: contiguous (kContiguous), or 4-D outputs in [B, L, H, D] memory, the
// heads merged next with no copy (kMergedHeads; other ranks contiguous).
enum class AttentionLayout { kAsPyTorch, kContiguous, kMergedHeads };

inline at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const std::optional<at::Tensor>& mask, std::optional<double> scale,
                                      AttentionLayout layout = AttentionLayout::kAsPyTorch) {
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale);
  if (layout == AttentionLayout::kAsPyTorch) return out;
  // (PyTorch's flash kernel gives its output q's stride order: a transposed q's is not contiguous)
  if (out.dim() != 4 || layout == AttentionLayout::kContiguous) return out.contiguous();
  return at::empty({out.size(0), out.size(2), out.size(1), out.size(3)}, out.options()).transpose(1, 2).copy_(out);
}

}  // namespace llga
