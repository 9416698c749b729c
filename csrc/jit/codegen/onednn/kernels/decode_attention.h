#pragma once
// llga::decode_attention(query, key, value, mask, scale, key_expanded, key_shape, value_expanded,
// value_shape): softmax(q k^T * scale + mask) v for a decoder's step (1-8 queries) over a KV cache,
// with grouped-query heads read in place: given repeat_kv's sizes, key and value are the cache's
// [B, Hkv, L, D] and query head h reads cache head h / n (H = Hkv x n), where eager copies the cache
// n times a layer (source.unsqueeze(2).expand(key_expanded).reshape(key_shape)) for PyTorch's
// attention. The DecodeAttention pass gives it such scaled_dot_product_attention calls; a call its
// kernel does not take (NaN/Inf, a fully masked row, sizes that repeat no heads, other shapes) runs
// PyTorch's attention on the keys and values as eager makes them.
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kDecodeAttention = c10::Symbol::fromQualString("llga::decode_attention");

// A row of scores at a time: from 9 queries on, the blocked kernels (or oneDNN's SDPA) pay.
constexpr int64_t kDecodeAttentionMaxQueries = 8;

// Whether the kernel runs attention of this head size and number of queries on this CPU.
bool decode_attention_runs(int64_t head_size, int64_t queries);

}  // namespace llga
