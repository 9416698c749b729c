#pragma once
// The bf16 half of llga::head64_attention (head64_attention.cpp registers the op and picks it):
// AVX512_BF16 dot products where the CPU has them and no AMX (oneDNN's AMX kernels are another class).
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace llga::head64 {

// A [batch, heads, rows, 64] tensor's data and strides in elements (its last dim contiguous).
struct View {
  const void* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  int64_t offset(int64_t b, int64_t h, int64_t i) const { return b * batch_stride + h * head_stride + i * row_stride; }
};

// A mask of the scores, [B|1, H|1, Q|1, keys] through its strides (broadcast dims stride 0):
// boolean (PyTorch's: True attends; a -Inf score where False) or float of the scores' dtype, added.
struct Mask {
  const void* data = nullptr;
  c10::ScalarType dtype = c10::ScalarType::Bool;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  int64_t offset(int64_t b, int64_t h, int64_t i) const { return b * batch_stride + h * head_stride + i * row_stride; }
};

// Whether this CPU runs the bf16 kernel: AVX512_BF16 without AMX.
bool bf16_kernel_runs();

// out (bf16, through o's strides) = softmax(q k^T * scale [+ mask]) v for bf16 q, k, v; false where
// PyTorch's attention must say what the result is (NaN or Inf in q, k, v; NaN or +Inf in a float
// mask; a fully masked row; scores that overflow).
bool attend_bf16(View q, View k, View v, const Mask& mask, int64_t batch, int64_t heads, int64_t queries, int64_t keys,
                 float scale, View o, void* out);

}  // namespace llga::head64
