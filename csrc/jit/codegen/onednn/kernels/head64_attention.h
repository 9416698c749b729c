#pragma once
// llga::head64_attention(query, key, value, mask, scale, merged_heads): softmax(q k^T * scale [+ mask]) v
// for heads of 64 values over 128+ keys (BERT, ViT, Whisper's encoder), where PyTorch's flash kernel
// and oneDNN's SDPA are slower (below). decompose_ops gives it the fp32 (and, with AVX512_BF16, bf16:
// head64_bf16.cpp) scaled_dot_product_attention of such heads, with a float or boolean mask or none;
// a call its kernel does not fit runs PyTorch's attention.
#include <ATen/core/symbol.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kHead64Attention = c10::Symbol::fromQualString("llga::head64_attention");

// Where it runs, each call's sizes time it against oneDNN's SDPA kernel and PyTorch's (choice site
// head64_attention). It computes groups of six (fp32) or twelve (bf16) query rows: one query, a
// decoder's step, would cost that many (it is llga::decode_attention's); below 96 queries or 128
// keys it is not a candidate.
constexpr int64_t kHead64AttentionMinKeys = 128;
constexpr int64_t kHead64AttentionMinQueries = 96;

// Whether the kernel runs attention of this dtype and head size, with this many queries and keys, on
// this CPU: fp32 with AVX2 + FMA, bf16 with AVX512_BF16 and no AMX (head64_bf16.h).
bool head64_attention_runs(c10::ScalarType dtype, int64_t head_size, int64_t queries, int64_t keys);

}  // namespace llga
