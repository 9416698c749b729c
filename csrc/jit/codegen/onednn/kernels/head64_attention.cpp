// llga::head64_attention: softmax(q k^T * scale [+ mask]) v for heads of 64 values, 96+ queries
// over 128+ keys (BERT's 12 heads of 64 over 128 positions, with a mask; ViT-B/16's over 197;
// Whisper's encoder: 6 over 1,500). This file registers the op and runs fp32 on AVX2 + FMA; bf16
// runs head64_bf16.cpp's kernel (AVX512_BF16).
//
// Here the two matmuls are the work (64 multiply-adds a score in each, one exponential), so the
// kernel is two register-blocked gemms with the softmax between them, 24 query rows at a time:
//   1. the block's scores against 16 keys at a time: for each key tile (K^T's 64 x 16, in L1), up
//      to four groups of six rows, each a 6 x 16 tile in twelve accumulators (two loads and six
//      broadcasts a twelve multiply-adds);
//   2. each row's mask (a float one added, a boolean one's False keys -inf), its maximum,
//      exp(score - max) in place and its sum (vector_math.h);
//   3. the values weighted by the probabilities, 256 keys at a time (their V rows in L2): for each
//      16-wide slice of the 64 values, the six-row groups, again a 6 x 16 tile a step.
// The block's scores (24 x keys floats) stay in L2. K^T is packed by key tiles (8 x 8 transposes)
// once a head by each thread whose blocks are of it, into that thread's buffer (one parallel region
// a call). A last block computes only the six-row groups its queries need (rows past the queries'
// end are zeros whose results are dropped); keys are padded to 16 for step 1 only (their scores
// -inf). q, v and the mask are read through their strides (the transposed views of a projection's
// output that models pass need no copy; a mask broadcast over heads or queries is read as it is).
// The output is written in [B, L, H, D] memory where the graph merges its heads next.
//
// Anything else (other head sizes, dtypes, a CPU without the kernel's instructions, NaN or Inf in q, k or v, NaN or
// +Inf in a float mask, a fully masked row, scores that overflow) is PyTorch's
// scaled_dot_product_attention: the same result as eager. (A -Inf score weighs e^-87, ~1e-38, not 0:
// invisible beside the sum's 1 or more.)
#include "jit/codegen/onednn/kernels/head64_attention.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <vector>

#include "jit/codegen/onednn/kernels/head64_bf16.h"
#include "jit/codegen/onednn/kernels/onednn_attention.h"
#include "jit/codegen/onednn/kernels/reference_attention.h"
#include "jit/codegen/onednn/kernels/vector_math.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/cpu_features.h"

namespace llga {

namespace {
using namespace vector_math;

constexpr int D = 64;
constexpr int kTileRows = 6;                       // rows of one register tile
constexpr int kGroups = 4;                         // tiles of rows a block
constexpr int kBlockRows = kTileRows * kGroups;    // 24 query rows at a time
constexpr int kKeyTile = 16;                       // keys (step 1) or values (step 3) of a tile: two registers
constexpr int64_t kKeyChunk = 256;                 // keys a pass of step 3

// s[r][0..16) = q[r] . kt[:, 0..16) for six rows of q (row stride D) against a packed key tile of
// K^T ([D][16]); s has row stride `padded`.
[[gnu::target("avx2,fma")]] inline void score_tile(const float* q, const float* kt, int64_t padded, float* s) {
  __m256 acc[kTileRows][2];
#pragma GCC unroll 6
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int d = 0; d < D; ++d)
    multiply_add_rows(acc, q + d, D, _mm256_load_ps(kt + d * kKeyTile), _mm256_load_ps(kt + d * kKeyTile + 8));
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    _mm256_storeu_ps(s + r * padded, acc[r][0]);
    _mm256_storeu_ps(s + r * padded + 8, acc[r][1]);
  }
}

// o[r][0..16) += sum_j p[r][j] v[j][0..16) over `keys` keys, six rows of p (row stride `padded`)
// and o (row stride D); v's rows `v_stride` apart.
[[gnu::target("avx2,fma")]] inline void value_tile(const float* p, int64_t padded, const float* v, int64_t v_stride,
                                                   int64_t keys, float* o) {
  __m256 acc[kTileRows][2];
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    acc[r][0] = _mm256_loadu_ps(o + r * D);
    acc[r][1] = _mm256_loadu_ps(o + r * D + 8);
  }
#pragma GCC unroll 2
  for (int64_t j = 0; j < keys; ++j)
    multiply_add_rows(acc, p + j, padded, _mm256_loadu_ps(v + j * v_stride), _mm256_loadu_ps(v + j * v_stride + 8));
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    _mm256_storeu_ps(o + r * D, acc[r][0]);
    _mm256_storeu_ps(o + r * D + 8, acc[r][1]);
  }
}

struct Operand {  // a [batch, heads, rows, D] tensor's data and strides (its last dim contiguous)
  const float* data;
  int64_t batch_stride, head_stride, row_stride;
  const float* row(int64_t b, int64_t h, int64_t i) const { return data + b * batch_stride + h * head_stride + i * row_stride; }
};

using head64::Mask;  // boolean or fp32 here

// The finite lanes of x (x - x is 0 exactly for them, NaN otherwise) and-ed into ok.
[[gnu::target("avx2,fma")]] inline __m256 and_finite(__m256 ok, __m256 x) {
  return _mm256_and_ps(ok, _mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_setzero_ps(), _CMP_EQ_OQ));
}

// The eight rows r[0..8) transposed in place: r[i][j] <- r[j][i].
[[gnu::target("avx2,fma")]] inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// One head's K^T packed by key tiles ([padded / 16][D][16], the padding keys zero) from its rows;
// false where k or that head's v holds a NaN or an Inf.
[[gnu::target("avx2,fma")]] bool pack_keys(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                                           int64_t keys, int64_t padded, float* kt) {
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    float* tile = kt + j0 / kKeyTile * kKeyTile * D + j0 % kKeyTile;
    for (int d = 0; d < D; d += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = j0 + i < keys ? _mm256_loadu_ps(k + (j0 + i) * k_stride + d) : _mm256_setzero_ps();
        ok = and_finite(ok, r[i]);
      }
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(tile + (d + i) * kKeyTile, r[i]);
    }
  }
  for (int64_t j = 0; j < keys; ++j)
    for (int d = 0; d < D; d += 8) ok = and_finite(ok, _mm256_loadu_ps(v + j * v_stride + d));
  return _mm256_movemask_ps(ok) == 0xff;
}

// The block's query rows times scale into qb (rows past `rows` zero); false where a product is not finite.
[[gnu::target("avx2,fma")]] bool scaled_rows(const Operand& q, int64_t b, int64_t h, int64_t first, int rows,
                                             float scale, float* qb) {
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256 s = _mm256_set1_ps(scale);
  for (int r = 0; r < kBlockRows; ++r) {
    const float* row = r < rows ? q.row(b, h, first + r) : nullptr;
    for (int d = 0; d < D; d += 8) {
      const __m256 x = _mm256_mul_ps(row ? _mm256_loadu_ps(row + d) : _mm256_setzero_ps(), s);
      ok = and_finite(ok, x);  // q's, and its product with a (user's) scale that may overflow
      _mm256_store_ps(qb + r * D + d, x);
    }
  }
  return _mm256_movemask_ps(ok) == 0xff;
}

// s[0..keys) += m[0..keys); false where m holds a NaN or +Inf (-Inf, a masked key, is fine).
[[gnu::target("avx2,fma")]] bool add_mask(float* s, const float* m, int64_t keys) {
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= keys; j += 8) {
    const __m256 x = _mm256_loadu_ps(m + j);
    ok = _mm256_and_ps(ok, _mm256_cmp_ps(x, inf, _CMP_LT_OQ));
    _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_loadu_ps(s + j), x));
  }
  bool fine = _mm256_movemask_ps(ok) == 0xff;
  for (; j < keys; ++j) {
    fine = fine && m[j] < std::numeric_limits<float>::infinity();
    s[j] += m[j];
  }
  return fine;
}

// s[j] = -Inf where m[j] is False, for j in [0, keys).
[[gnu::target("avx2,fma")]] void select_mask(float* s, const bool* m, int64_t keys) {
  const __m256 minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= keys; j += 8) {
    const __m256i attend = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m + j))),
                                              _mm256_setzero_si256());
    _mm256_storeu_ps(s + j, _mm256_blendv_ps(minus_inf, _mm256_loadu_ps(s + j), _mm256_castsi256_ps(attend)));
  }
  for (; j < keys; ++j)
    if (!m[j]) s[j] = -std::numeric_limits<float>::infinity();
}

// The mask's row applied to a row of scores; false where it holds what the kernel does not compute as PyTorch does.
bool apply_mask(float* s, const Mask& mask, int64_t offset, int64_t keys) {
  if (mask.dtype == at::kFloat) return add_mask(s, static_cast<const float*>(mask.data) + offset, keys);
  select_mask(s, static_cast<const bool*>(mask.data) + offset, keys);
  return true;
}

// out's rows [first, first + rows) from the block's weighted values over their weights' sums.
[[gnu::target("avx2,fma")]] void normalized_rows(const float* ob, const float* sums, int rows, const Operand& o,
                                                 int64_t b, int64_t h, int64_t first, float* out) {
  for (int r = 0; r < rows; ++r) {
    float* row = out + (o.row(b, h, first + r) - o.data);
    const __m256 inv = _mm256_set1_ps(1.0f / sums[r]);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(row + d, _mm256_mul_ps(_mm256_load_ps(ob + r * D + d), inv));
  }
}

// out [batch, heads, queries, D] (through its strides: `o`) from q, k and v through theirs and the
// mask where there is one. False where some row's scores overflowed, or q, k, v or the mask holds
// what the kernel does not compute as PyTorch does (NaN, Inf; -Inf in the mask is fine).
// A thread packs K^T for each head its blocks are of, once (one parallel region a call).
bool attend(Operand q, Operand k, Operand v, const Mask& mask, int64_t batch, int64_t heads, int64_t queries,
            int64_t keys, float scale, Operand o, float* out) {
  const int64_t blocks = (queries + kBlockRows - 1) / kBlockRows;
  const int64_t padded = (keys + kKeyTile - 1) / kKeyTile * kKeyTile;
  std::atomic<bool> fallback{false};
  at::parallel_for(0, batch * heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(kBlockRows * padded);
    float* kt = static_cast<float*>(std::aligned_alloc(32, padded * D * sizeof(float)));
    if (!kt) throw std::bad_alloc();
    std::unique_ptr<float, decltype(&std::free)> kt_owner(kt, &std::free);
    alignas(32) float qb[kBlockRows * D], ob[kBlockRows * D];
    float sums[kBlockRows];
    int64_t packed_head = -1;
    for (int64_t task = begin; task < end && !fallback.load(std::memory_order_relaxed); ++task) {
      const int64_t bh = task / blocks, b = bh / heads, h = bh % heads, first = task % blocks * kBlockRows;
      const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, queries - first));
      const int groups = (rows + kTileRows - 1) / kTileRows;  // of six rows: a last block's tail is cut short
      if (bh != packed_head) {
        if (!pack_keys(k.row(b, h, 0), k.row_stride, v.row(b, h, 0), v.row_stride, keys, padded, kt)) {
          fallback.store(true, std::memory_order_relaxed);
          break;
        }
        packed_head = bh;
      }
      if (!scaled_rows(q, b, h, first, rows, scale, qb)) {
        fallback.store(true, std::memory_order_relaxed);
        break;
      }
      for (int64_t j = 0; j < padded; j += kKeyTile)
        for (int g = 0; g < groups; ++g)
          score_tile(qb + g * kTileRows * D, kt + j * D, padded, s.data() + g * kTileRows * padded + j);
      for (int r = 0; r < groups * kTileRows; ++r) {
        if (mask.data && r < rows && !apply_mask(s.data() + r * padded, mask, mask.offset(b, h, first + r), keys))
          fallback.store(true, std::memory_order_relaxed);
        sums[r] = exponentials(s.data() + r * padded, keys, padded);
        if (r < rows && std::isnan(sums[r])) fallback.store(true, std::memory_order_relaxed);
      }
      std::fill(ob, ob + groups * kTileRows * D, 0.0f);
      const float* vh = v.row(b, h, 0);
      for (int64_t j = 0; j < keys; j += kKeyChunk) {
        const int64_t n = std::min(kKeyChunk, keys - j);
        for (int c = 0; c < D; c += kKeyTile)
          for (int g = 0; g < groups; ++g)
            value_tile(s.data() + g * kTileRows * padded + j, padded, vh + j * v.row_stride + c, v.row_stride, n,
                       ob + g * kTileRows * D + c);
      }
      normalized_rows(ob, sums, rows, o, b, h, first, out);
    }
  });
  return !fallback.load();
}

// An empty output: [B, L, H, D] memory where the heads are merged next (see head64_attention()).
at::Tensor empty_output(c10::IntArrayRef sizes, const at::TensorOptions& options, bool merged_heads) {
  if (!merged_heads) return at::empty(sizes, options);
  return at::empty({sizes[0], sizes[2], sizes[1], sizes[3]}, options).transpose(1, 2);
}

Operand operand(const at::Tensor& t) {
  return {t.const_data_ptr<float>(), t.stride(0), t.stride(1), t.stride(2)};
}

// The mask's view for the kernels: a boolean [B|1, H|1, Q|1, keys] tensor or one of the scores'
// dtype, broadcast to the scores' sizes (its last dim read contiguous); none where it is something else.
std::optional<Mask> mask_view(const at::Tensor& m, c10::IntArrayRef scores, at::ScalarType dtype) {
  if (m.dim() != 4 || !(m.scalar_type() == at::kBool || m.scalar_type() == dtype) || !m.device().is_cpu() ||
      m.requires_grad() || m.size(3) != scores[3] || m.stride(3) != 1)
    return std::nullopt;
  int64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    if (m.size(i) != 1 && m.size(i) != scores[i]) return std::nullopt;
    strides[i] = m.size(i) == 1 ? 0 : m.stride(i);
  }
  return Mask{m.const_data_ptr(), m.scalar_type(), strides[0], strides[1], strides[2]};
}

head64::View view(const at::Tensor& t) { return {t.const_data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }

// merged_heads: the output is written in [B, L, H, D] memory (its heads are merged next, by a
// transpose(1, 2): that and the reshape after it are then views); else contiguous.
at::Tensor head64_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask, std::optional<double> scale, bool merged_heads) {
  const at::ScalarType dtype = q.scalar_type();
  auto fits = [&](const at::Tensor& t) {
    return t.dim() == 4 && t.scalar_type() == dtype && t.device().is_cpu() && !t.requires_grad() && t.size(3) == D;
  };
  // in the kernel's output layout, so that a call the kernel does not take gives the strides the graph was typed with
  auto fallback = [&] {
    return reference_attention(q, k, v, mask, scale, merged_heads ? AttentionLayout::kMergedHeads : AttentionLayout::kContiguous);
  };
  const bool runs = dtype == at::kFloat ? cpu_features().avx2_fma : dtype == at::kBFloat16 && head64::bf16_kernel_runs();
  if (!runs || !fits(q) || !fits(k) || !fits(v)) return fallback();
  const int64_t keys = k.size(2);
  if (v.size(2) != keys || keys == 0 || q.size(0) != k.size(0) || q.size(0) != v.size(0) || q.size(1) != k.size(1) ||
      q.size(1) != v.size(1))
    return fallback();
  const float s = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2);
  Mask m;
  if (mask) {
    auto view = mask_view(*mask, {batch, heads, queries, keys}, dtype);
    if (!view) return fallback();
    m = *view;
  }
  auto own = [&] {
    // q, k and v read in place where their rows are contiguous (a transposed view of [B, L, H, D] is).
    const at::Tensor qr = q.stride(3) == 1 ? q : q.contiguous(), kr = k.stride(3) == 1 ? k : k.contiguous(),
                     vr = v.stride(3) == 1 ? v : v.contiguous();
    at::Tensor out = empty_output({batch, heads, queries, D}, q.options(), merged_heads);
    bool done = dtype == at::kFloat ? attend(operand(qr), operand(kr), operand(vr), m, batch, heads, queries, keys, s,
                                             operand(out), out.mutable_data_ptr<float>())
                                    : head64::attend_bf16(view(qr), view(kr), view(vr), m, batch, heads, queries, keys, s,
                                                          view(out), out.mutable_data_ptr());
    return done ? out : fallback();  // NaN or Inf: PyTorch's kernel says what they become
  };
  // The kernel, oneDNN's SDPA kernel, or PyTorch's (its flash kernel): which is faster differs
  // between CPUs (AMX's bf16 tiles) and sizes (choice site head64_attention).
  static choices::Chooser<at::Tensor> chooser("head64_attention");
  const choices::Key key{static_cast<int64_t>(dtype), batch * heads, choices::bucket(queries), choices::bucket(keys),
                         mask ? (mask->scalar_type() == at::kBool ? 2 : 1) : 0, merged_heads};
  auto describe = [&] {
    return std::pair{std::string("llga::head64_attention"),
                     c10::str(q.sizes(), " x ", keys, " keys ", dtype, mask ? ", masked" : "")};
  };
  const AttentionLayout layout = merged_heads ? AttentionLayout::kMergedHeads : AttentionLayout::kContiguous;
  return chooser.run(key, describe, [&](size_t i) {
    if (i == 0) return own();
    if (i == 1)
      if (auto out = onednn_attention(q, k, v, mask, scale, layout)) return *out;
    return fallback();
  });
}

torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::head64_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float? scale, bool merged_heads) -> Tensor",
    [](torch::jit::Stack& stack) {
      RECORD_FUNCTION("llga::head64_attention", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
      bool merged_heads = torch::jit::pop(stack).toBool();
      auto scale = torch::jit::pop(stack).toOptional<double>();
      auto mask = torch::jit::pop(stack).toOptional<at::Tensor>();
      at::Tensor v = torch::jit::pop(stack).toTensor();
      at::Tensor k = torch::jit::pop(stack).toTensor();
      at::Tensor q = torch::jit::pop(stack).toTensor();
      torch::jit::push(stack, head64_attention(q, k, v, mask, scale, merged_heads));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

bool head64_attention_runs(c10::ScalarType dtype, int64_t head_size, int64_t queries, int64_t keys) {
  const bool cpu = dtype == at::kFloat ? cpu_features().avx2_fma : dtype == at::kBFloat16 && head64::bf16_kernel_runs();
  return cpu && head_size == D && queries >= kHead64AttentionMinQueries && keys >= kHead64AttentionMinKeys;
}

}  // namespace llga
