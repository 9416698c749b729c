#pragma once
// llga::head64_attention(query, key, value, scale): softmax(q k^T * scale) v for heads of 64 values
// over many keys (Whisper's encoder), where PyTorch's flash kernel and oneDNN's SDPA are slower
// (head64_attention.cpp says by how much). decompose_ops gives it the unmasked fp32
// scaled_dot_product_attention of such heads; a call its kernel does not fit runs PyTorch's attention.
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kHead64Attention = c10::Symbol::fromQualString("llga::head64_attention");

// Below this many keys oneDNN's SDPA kernel is as quick.
constexpr int64_t kHead64AttentionMinKeys = 1024;

// Whether the kernel runs attention of this head size over this many keys on this CPU.
bool head64_attention_runs(int64_t head_size, int64_t keys);

}  // namespace llga
