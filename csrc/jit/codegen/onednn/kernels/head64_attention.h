#pragma once
// llga::head64_attention(query, key, value, scale): softmax(q k^T * scale) v for heads of 64 values
// over 128+ keys (Whisper's encoder, ViT), where PyTorch's flash kernel and oneDNN's SDPA are slower
// (head64_attention.cpp says by how much). decompose_ops gives it the unmasked fp32
// scaled_dot_product_attention of such heads; a call its kernel does not fit runs PyTorch's attention.
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kHead64Attention = c10::Symbol::fromQualString("llga::head64_attention");

// From 128 keys on it beats oneDNN's SDPA kernel (1.1x at 128 and 197, 1.2x at 512, 12 heads of
// as many queries). It computes 24 query rows at a time: with fewer queries than 96 more than a
// fifth of its work could be padding (one query, a decoder's step, would cost 24).
constexpr int64_t kHead64AttentionMinKeys = 128;
constexpr int64_t kHead64AttentionMinQueries = 96;

// Whether the kernel runs attention of this head size, with this many queries and keys, on this CPU.
bool head64_attention_runs(int64_t head_size, int64_t queries, int64_t keys);

}  // namespace llga
