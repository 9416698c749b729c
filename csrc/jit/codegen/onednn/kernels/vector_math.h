#pragma once
// AVX2 + FMA helpers of torch_llga's own kernels (kernels/*.cpp): fp32 and bf16 loads as floats, a
// vectorized exponential, horizontal sums and maxima, a finiteness scan, a row's softmax numerators
// in place, and a register tile's multiply-adds.
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "onednn/cpu_features.h"

namespace llga::vector_math {

// Their callers check cpu_features().avx2_fma (onednn/cpu_features.h) first.
// 8 values as floats: fp32 as they are, bf16 widened (a bf16 is the top half of its float), so a
// bf16 weight or cache streams half the bytes and is computed in fp32 as eager computes it.
[[gnu::target("avx2,fma")]] inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
[[gnu::target("avx2,fma")]] inline __m256 load8(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
// The first `count` (< 8) values, the rest 0.
template <typename T>
[[gnu::target("avx2,fma")]] inline __m256 load_tail(const T* p, int64_t count) {
  alignas(32) float t[8] = {};
  for (int64_t i = 0; i < count; ++i) t[i] = static_cast<float>(p[i]);
  return _mm256_load_ps(t);
}

// exp(x) for x <= 0 (scores minus their row's maximum): 2^n * e^r with n = round(x / ln 2) and
// |r| <= ln 2 / 2, e^r by a degree-5 polynomial fitted for relative error: at most 2.2e-7 above
// x = -10, 4.3e-7 below (n ln 2 is subtracted in one step: its rounding grows with n, where the
// terms are too small to count). The exponentials are the most of the small-head kernel's work: 8
// multiply-adds a register, where Cephes' expf (~1 ulp) takes 11; the kernel's error against
// float64 is the scores' rounding either way (1-2e-5 on the tests' inputs, as eager's). n is
// rounded by adding 1.5 * 2^23 + 127, which leaves n + 127, the exponent's bits, at the bottom of
// the sum's mantissa. Below -87.3 it gives e^-87.3 (~1e-38, a normal float), not 0: nothing a sum
// of at least 1 (the maximum's own term) can see.
[[gnu::target("avx2,fma")]] inline __m256 exp_nonpositive(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12583039.0f);  // 1.5 * 2^23 + 127
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);  // (maxps returns its second operand for a NaN: x's)
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 r = _mm256_fnmadd_ps(_mm256_sub_ps(t, magic), _mm256_set1_ps(0.693147182f), x);
  __m256 p = _mm256_set1_ps(8.297654800e-03f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.191538319e-02f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666757464e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.999889433e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.999997020e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.000000119e+00f));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

[[gnu::target("avx2,fma")]] inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

[[gnu::target("avx2,fma")]] inline float horizontal_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A row's scores -> exp(score - max) (the padding's -inf included); returns their sum,
// or NaN where the scores overflowed (the row's maximum is not finite) or one is NaN (a masked
// key's -inf added to a score that overflowed to +inf: its exponential is NaN, and so the sum).
[[gnu::target("avx2,fma")]] inline float exponentials(float* s, int64_t keys, int64_t padded) {
  for (int64_t j = keys; j < padded; ++j) s[j] = -std::numeric_limits<float>::infinity();
  __m256 row_max = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < padded; j += 8) row_max = _mm256_max_ps(row_max, _mm256_loadu_ps(s + j));
  const float max = horizontal_max(row_max);
  if (!std::isfinite(max)) return std::numeric_limits<float>::quiet_NaN();
  const __m256 m = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 16) {  // two at a time: each is a long chain of dependent steps
    const __m256 e0 = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    const __m256 e1 = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), m));
    _mm256_storeu_ps(s + j, e0);
    _mm256_storeu_ps(s + j + 8, e1);
    sum = _mm256_add_ps(sum, _mm256_add_ps(e0, e1));
  }
  return horizontal_sum(sum);
}

// acc[r][0] += a[r * stride] * b0 and acc[r][1] += a[r * stride] * b1 for R rows: a row's value
// broadcast against two registers (a register tile of R x 16 products: of keys in a scores step, of
// values in a weighted-values step).
template <int R>
[[gnu::target("avx2,fma")]] inline void multiply_add_rows(__m256 (&acc)[R][2], const float* a, int64_t stride, __m256 b0,
                                                          __m256 b1) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 ab = _mm256_broadcast_ss(a + r * stride);
    acc[r][0] = _mm256_fmadd_ps(ab, b0, acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(ab, b1, acc[r][1]);
  }
}

}  // namespace llga::vector_math
