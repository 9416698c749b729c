#pragma once
// llga::small_head_attention(query, key, value, scale): softmax(q k^T * scale) v for heads of 8 or
// 16 values over many keys (a diffusion UNet's self-attention), where oneDNN's SDPA kernel is slow
// (small_head_attention.cpp says by how much). decompose_ops gives it the unmasked fp32
// scaled_dot_product_attention of such heads instead of spelling the attention out for oneDNN;
// a call its kernel does not fit runs PyTorch's attention.
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kSmallHeadAttention = c10::Symbol::fromQualString("llga::small_head_attention");

// Below this many keys oneDNN's kernel is as quick (its scores fit the caches anyway).
constexpr int64_t kSmallHeadAttentionMinKeys = 512;

// Whether the kernel runs attention of this head size over this many keys on this CPU.
bool small_head_attention_runs(int64_t head_size, int64_t keys);

}  // namespace llga
