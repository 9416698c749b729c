#pragma once
// The one scan for NaN and Inf: the guards' check of a group's inputs (runtime/guard_runtime.cpp)
// and the own kernels', which hand a call with NaN or Inf to PyTorch's kernel (whose results say
// what they become).
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace llga {

// Whether any of n fp32 (32-bit) or bf16 (16-bit) values, given as their bits, is NaN or Inf.
bool any_nonfinite(const uint32_t* bits, int64_t n);
bool any_nonfinite(const uint16_t* bits, int64_t n);
// The same, large buffers on PyTorch's intra-op threads (Bits: uint32_t or uint16_t).
template <typename Bits>
bool any_nonfinite_parallel(const Bits* bits, int64_t n);

inline bool all_finite(const float* x, int64_t n) { return !any_nonfinite(reinterpret_cast<const uint32_t*>(x), n); }
inline bool all_finite(const c10::BFloat16* x, int64_t n) { return !any_nonfinite(reinterpret_cast<const uint16_t*>(x), n); }

}  // namespace llga
