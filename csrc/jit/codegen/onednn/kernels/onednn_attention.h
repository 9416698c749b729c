#pragma once
// oneDNN's fused SDPA kernel for one attention call's sizes: the candidate the own attention
// kernels are timed against beside PyTorch's (choice sites head64_attention and
// small_head_attention), so that where oneDNN's kernel is the fastest on a CPU, it runs.
#include <ATen/Tensor.h>
#include <ATen/core/symbol.h>

#include <optional>

#include "jit/codegen/onednn/kernels/reference_attention.h"

namespace llga {

// softmax(q k^T * scale [+ mask]) v as one oneDNN Graph partition compiled for these sizes, strides
// and dtypes (kept: the last kOnednnAttentionCapacity sizes), its output in `layout` (kAsPyTorch:
// contiguous); a boolean mask as its bias (True attends), a fully masked row 0 as in PyTorch's.
// nullopt where oneDNN takes it as no single partition, or does not compile it.
std::optional<at::Tensor> onednn_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const std::optional<at::Tensor>& mask, std::optional<double> scale,
                                           AttentionLayout layout);
constexpr size_t kOnednnAttentionCapacity = 64;

// llga::long_attention(q, k, v, scale, merged_heads): unmasked fp32 attention over many keys that no
// own kernel takes, PyTorch's flash kernel or oneDNN's SDPA by measurement (choice site
// long_attention); its output contiguous, or in [B, L, H, D] memory (merged_heads) where only the
// heads' merge reads it.
inline const c10::Symbol kLongAttention = c10::Symbol::fromQualString("llga::long_attention");

}  // namespace llga
