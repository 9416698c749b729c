// llga::head64_attention in bf16: softmax(q k^T * scale [+ mask]) v for bf16 heads of 64 values,
// with AVX512_BF16's dot products (vdpbf16ps: 16 fp32 sums, each of two bf16 products, a register).
// It has head64_attention.cpp's shape, 24 query rows at a time:
//   1. the block's scores against 32 keys at a time (16 at the end): 12 x 32 register tiles, 24
//      accumulators; a step is one query pair (two bf16 of one row, broadcast as 32 bits) against
//      the same pair of 32 keys (K^T packed per head as [key tile][pair][16 keys][2]);
//   2. in fp32: each row's scale and mask, its maximum, exp(score - max) and its sum; the weights
//      rounded to bf16 (as PyTorch's bf16 attention rounds them before the second matmul);
//   3. the values weighted: 12 x 32 tiles of the output, a step one pair of keys' weights against
//      their V rows (V packed per head as [key pair][64][2]).
// Products are exact and summed in fp32 (PyTorch's bf16 matmuls also sum in fp32); the output is
// rounded to bf16 once. A thread packs K and V once a head its blocks are of.
#include "jit/codegen/onednn/kernels/head64_bf16.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>

#include "onednn/cpu_features.h"
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "jit/codegen/onednn/kernels/finite_scan.h"
#include "jit/codegen/onednn/kernels/vector_math.h"

#define LLGA_BF16_TARGET [[gnu::target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]]

namespace llga::head64 {

namespace {

using bf16 = uint16_t;
constexpr int D = 64;
constexpr int kPairs = D / 2;
constexpr int kTileRows = 12;
constexpr int kBlockRows = 24;
constexpr int kKeyTile = 16;             // keys of one register in step 1
constexpr int kTileElems = kKeyTile * D;  // a packed key tile: [32 pairs][16 keys][2]

LLGA_BF16_TARGET inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// One head's K^T ([padded / 16][32 pairs][16][2], padding keys zero) and V ([pairs of keys][64][2],
// an odd last key paired with zeros); false where k or v is not finite.
LLGA_BF16_TARGET bool pack_head(const bf16* k, int64_t k_stride, const bf16* v, int64_t v_stride, int64_t keys,
                                int64_t padded, bf16* kt, bf16* vp) {
  bool finite = true;
  for (int64_t j = 0; j < padded; ++j) {
    uint32_t* tile = reinterpret_cast<uint32_t*>(kt + j / kKeyTile * kTileElems) + j % kKeyTile;
    if (j >= keys) {
      for (int p = 0; p < kPairs; ++p) tile[p * kKeyTile] = 0;
      continue;
    }
    const bf16* row = k + j * k_stride;
    finite = finite && !any_nonfinite(row, D);
    uint32_t pairs[kPairs];
    std::memcpy(pairs, row, sizeof(pairs));
    for (int p = 0; p < kPairs; ++p) tile[p * kKeyTile] = pairs[p];
  }
  const __m128i zero = _mm_setzero_si128();
  for (int64_t j = 0; j < keys; j += 2) {
    const bf16* a = v + j * v_stride;
    const bf16* b = j + 1 < keys ? v + (j + 1) * v_stride : nullptr;
    finite = finite && !any_nonfinite(a, D) && (!b || !any_nonfinite(b, D));
    bf16* dst = vp + j / 2 * 2 * D;
    for (int d = 0; d < D; d += 8) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + d));
      const __m128i y = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + d)) : zero;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * d), _mm_unpacklo_epi16(x, y));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * d + 8), _mm_unpackhi_epi16(x, y));
    }
  }
  return finite;
}

// s[r][0..16 * N) = q[r] . K^T for twelve rows (q[r]: a row's 64 bf16, read as 32 pairs) against N
// packed key tiles.
template <int N>
LLGA_BF16_TARGET inline void score_tile(const bf16* const* q, const bf16* kt, int64_t padded, float* s) {
  __m512 acc[kTileRows][N];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int p = 0; p < kPairs; ++p) {
    __m512i k[N];
    for (int t = 0; t < N; ++t) k[t] = _mm512_loadu_si512(kt + t * kTileElems + p * 2 * kKeyTile);
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      uint32_t pair;
      std::memcpy(&pair, q[r] + 2 * p, sizeof(pair));
      const __m512i a = _mm512_set1_epi32(static_cast<int>(pair));
      for (int t = 0; t < N; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(a), as_bh(k[t]));
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int t = 0; t < N; ++t) _mm512_storeu_ps(s + r * padded + t * kKeyTile, acc[r][t]);
}

// o[r][c..c + 32) = sum over key pairs of p[r]'s pair . V's, for twelve rows of bf16 weights (row
// stride `stride`, in bf16) against V packed by key pairs.
LLGA_BF16_TARGET inline void value_tile(const bf16* p, int64_t stride, const bf16* vp, int64_t pairs, int c, float* o) {
  __m512 acc[kTileRows][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t j = 0; j < pairs; ++j) {
    const __m512i v0 = _mm512_loadu_si512(vp + j * 2 * D + 2 * c), v1 = _mm512_loadu_si512(vp + j * 2 * D + 2 * c + 32);
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      uint32_t w;
      std::memcpy(&w, p + r * stride + 2 * j, sizeof(w));
      const __m512i a = _mm512_set1_epi32(static_cast<int>(w));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], as_bh(a), as_bh(v0));
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], as_bh(a), as_bh(v1));
    }
  }
  for (int r = 0; r < kTileRows; ++r) {
    _mm512_storeu_ps(o + r * D + c, acc[r][0]);
    _mm512_storeu_ps(o + r * D + c + 16, acc[r][1]);
  }
}

LLGA_BF16_TARGET inline __m512 widen(const bf16* x) {
  // (maskz forms: GCC 12 warns of the plain ones' undefined passthrough)
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
}

// A row's scores times scale, its mask applied (a float one added: false where it holds NaN or
// +Inf; a boolean one's False keys -Inf).
LLGA_BF16_TARGET bool scale_and_mask(float* s, int64_t keys, float scale, const Mask& mask, int64_t offset) {
  const __m512 f = _mm512_set1_ps(scale), minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
               inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  bool fine = true;
  int64_t j = 0;
  for (; j + 16 <= keys; j += 16) {
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + j), f);
    if (mask.data && mask.dtype == c10::ScalarType::Bool) {
      const __m128i m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const bool*>(mask.data) + offset + j));
      x = _mm512_mask_blend_ps(_mm_cmpeq_epi8_mask(m, _mm_setzero_si128()), x, minus_inf);
    } else if (mask.data) {
      const __m512 m = mask.dtype == c10::ScalarType::Float ? _mm512_loadu_ps(static_cast<const float*>(mask.data) + offset + j)
                                                            : widen(static_cast<const bf16*>(mask.data) + offset + j);
      fine = fine && _mm512_cmp_ps_mask(m, inf, _CMP_LT_OQ) == 0xffff;
      x = _mm512_add_ps(x, m);
    }
    _mm512_storeu_ps(s + j, x);
  }
  for (; j < keys; ++j) {
    float x = s[j] * scale;
    if (mask.data && mask.dtype == c10::ScalarType::Bool) {
      if (!static_cast<const bool*>(mask.data)[offset + j]) x = -std::numeric_limits<float>::infinity();
    } else if (mask.data) {
      const float m = mask.dtype == c10::ScalarType::Float
                          ? static_cast<const float*>(mask.data)[offset + j]
                          : static_cast<float>(c10::BFloat16(static_cast<const bf16*>(mask.data)[offset + j], c10::BFloat16::from_bits()));
      fine = fine && m < std::numeric_limits<float>::infinity();
      x += m;
    }
    s[j] = x;
  }
  return fine;
}

// A row of weights (fp32, `count` a multiple of 16) rounded to bf16.
LLGA_BF16_TARGET inline void round_row(const float* s, int64_t count, bf16* p) {
  for (int64_t j = 0; j < count; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + j)));
}

// Row r of out from the block's weighted values over its weights' sum, rounded to bf16.
LLGA_BF16_TARGET inline void store_row(const float* o, float sum, bf16* out) {
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int d = 0; d < D; d += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o + d), inv)));
}

template <typename T>
struct Freed {
  void operator()(T* p) const { std::free(p); }
};
template <typename T>
std::unique_ptr<T, Freed<T>> aligned(size_t count) {
  T* p = static_cast<T*>(std::aligned_alloc(64, (count * sizeof(T) + 63) / 64 * 64));
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<T, Freed<T>>(p);
}

}  // namespace

bool bf16_kernel_runs() {
  static const bool runs = cpu_features().avx512_bf16 && !cpu_features().amx_bf16;
  return runs;
}

LLGA_BF16_TARGET bool attend_bf16(View q, View k, View v, const Mask& mask, int64_t batch, int64_t heads, int64_t queries,
                                  int64_t keys, float scale, View o, void* out) {
  const int64_t blocks = (queries + kBlockRows - 1) / kBlockRows;
  const int64_t padded = (keys + kKeyTile - 1) / kKeyTile * kKeyTile;  // also even: the weights' pairs
  const int64_t pairs = (keys + 1) / 2;
  const auto* qd = static_cast<const bf16*>(q.data);
  const auto* kd = static_cast<const bf16*>(k.data);
  const auto* vd = static_cast<const bf16*>(v.data);
  auto* od = static_cast<bf16*>(out);
  std::atomic<bool> fallback{false};
  at::parallel_for(0, batch * heads * blocks, 1, [&](int64_t begin, int64_t end) {
    auto kt = aligned<bf16>(padded * D), vp = aligned<bf16>(pairs * 2 * D), p = aligned<bf16>(kBlockRows * padded);
    auto s = aligned<float>(kBlockRows * padded), ob = aligned<float>(kBlockRows * D);
    float sums[kBlockRows];
    static const bf16 zeros[D] = {};
    int64_t packed_head = -1;
    for (int64_t task = begin; task < end && !fallback.load(std::memory_order_relaxed); ++task) {
      const int64_t bh = task / blocks, b = bh / heads, h = bh % heads, first = task % blocks * kBlockRows;
      const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, queries - first));
      const int groups = (rows + kTileRows - 1) / kTileRows;
      if (bh != packed_head) {
        if (!pack_head(kd + k.offset(b, h, 0), k.row_stride, vd + v.offset(b, h, 0), v.row_stride, keys, padded, kt.get(),
                       vp.get())) {
          fallback.store(true, std::memory_order_relaxed);
          break;
        }
        packed_head = bh;
      }
      const bf16* qrows[kBlockRows];
      bool finite = true;
      for (int r = 0; r < kBlockRows; ++r) {
        const bf16* row = r < rows ? qd + q.offset(b, h, first + r) : nullptr;
        finite = finite && (!row || !any_nonfinite(row, D));
        qrows[r] = row ? row : zeros;
      }
      if (!finite) {
        fallback.store(true, std::memory_order_relaxed);
        break;
      }
      for (int g = 0; g < groups; ++g) {
        int64_t j = 0;
        for (; j + 2 * kKeyTile <= padded; j += 2 * kKeyTile)
          score_tile<2>(qrows + g * kTileRows, kt.get() + j * D, padded, s.get() + g * kTileRows * padded + j);
        if (j < padded) score_tile<1>(qrows + g * kTileRows, kt.get() + j * D, padded, s.get() + g * kTileRows * padded + j);
      }
      for (int r = 0; r < groups * kTileRows; ++r) {
        float* row = s.get() + r * padded;
        if (r < rows && !scale_and_mask(row, keys, scale, mask, mask.offset(b, h, first + r)))
          fallback.store(true, std::memory_order_relaxed);
        sums[r] = vector_math::exponentials(row, keys, padded);
        if (r < rows && std::isnan(sums[r])) fallback.store(true, std::memory_order_relaxed);
        round_row(row, padded, p.get() + r * padded);
      }
      for (int g = 0; g < groups; ++g)
        for (int c = 0; c < D; c += 32)
          value_tile(p.get() + g * kTileRows * padded, padded, vp.get(), pairs, c, ob.get() + g * kTileRows * D);
      for (int r = 0; r < rows; ++r) store_row(ob.get() + r * D, sums[r], od + o.offset(b, h, first + r));
    }
  });
  return !fallback.load();
}

}  // namespace llga::head64
