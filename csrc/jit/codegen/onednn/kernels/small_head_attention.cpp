// llga::small_head_attention: softmax(q k^T * scale) v for heads of 8 or 16 values over many keys,
// fp32, on AVX2 + FMA (a diffusion UNet's self-attention: 8 heads of 8 over 1,024 positions).
//
// With heads this narrow, attention is its softmax: each score costs one multiply-add per value in
// either matmul and one exponential. oneDNN's SDPA kernel runs the two matmuls as gemms with a
// reduction of 8 (~25 GFLOP/s here). This kernel takes four query rows at a time:
//   1. their scores against 16 keys at a time, eight accumulators (a key's values are read once
//      for the four rows);
//   2. each row's maximum, then exp(score - max) in place, vectorized, and the row's sum
//      (vector_math.h's exponentials);
//   3. the values weighted by the four rows' probabilities, two keys at a time, eight accumulators.
// The four rows' scores (4 x keys floats) stay in L1, a head's K^T and V in L2. Keys are padded to
// 16 with zero values and scores of -inf, which add e^-87.3 * 0 to the output and ~1e-38 to a sum of
// at least 1.
//
// Anything else (other head sizes, dtypes, a CPU without AVX2/FMA, NaN or Inf in q, k or v, scores
// that overflow) is PyTorch's scaled_dot_product_attention: the same result as eager.
#include "jit/codegen/onednn/kernels/small_head_attention.h"
#include "jit/codegen/onednn/kernels/onednn_attention.h"
#include "jit/codegen/onednn/kernels/reference_attention.h"
#include "jit/codegen/onednn/kernels/finite_scan.h"
#include "jit/codegen/onednn/kernels/vector_math.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/cpu_features.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace llga {

namespace {
using namespace vector_math;

constexpr int kRows = 4;   // query rows at a time
constexpr int kKeyStep = 16;  // keys per step of the scores (two registers)

// Step 1: s[r][j] = q[r] . kt[:, j] for four rows q [kRows][D] (scaled) and padded keys kt [D][padded].
template <int D>
[[gnu::target("avx2,fma")]] void scores(const float* q, const float* kt, int64_t padded, float* s) {
  for (int64_t j = 0; j < padded; j += kKeyStep) {
    __m256 acc[kRows][2];
#pragma GCC unroll 4
    for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int d = 0; d < D; ++d)
      multiply_add_rows(acc, q + d, D, _mm256_loadu_ps(kt + d * padded + j), _mm256_loadu_ps(kt + d * padded + j + 8));
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      _mm256_storeu_ps(s + r * padded + j, acc[r][0]);
      _mm256_storeu_ps(s + r * padded + j + 8, acc[r][1]);
    }
  }
}

// Step 3: out[r] = sum_j p[r][j] v[j] / sums[r] for the block's first `rows` rows; v [padded][D].
template <int D>
[[gnu::target("avx2,fma")]] void weighted_values(const float* p, const float* v, int64_t padded, const float* sums, int rows,
                                                 float* out) {
  __m256 acc[kRows][2];
#pragma GCC unroll 4
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  alignas(32) float result[kRows][D];
  if constexpr (D == 8) {  // a key's values are one register: two keys at a time
    for (int64_t j = 0; j < padded; j += 2) {
      const __m256 v0 = _mm256_loadu_ps(v + j * 8), v1 = _mm256_loadu_ps(v + j * 8 + 8);
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        acc[r][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * padded + j), v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * padded + j + 1), v1, acc[r][1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(result[r], _mm256_add_ps(acc[r][0], acc[r][1]));
  } else {  // 16 values: two registers a key
    for (int64_t j = 0; j < padded; ++j)
      multiply_add_rows(acc, p + j, padded, _mm256_loadu_ps(v + j * 16), _mm256_loadu_ps(v + j * 16 + 8));
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      _mm256_storeu_ps(result[r], acc[r][0]);
      _mm256_storeu_ps(result[r] + 8, acc[r][1]);
    }
  }
  // Through a buffer: the accumulators stay registers only where no loop of a variable count reads them.
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) out[r * D + d] = result[r][d] / sums[r];
}

// q [heads, queries, D], kt [heads, D, padded], v [heads, padded, D], out [heads, queries, D].
// False where some row's scores overflowed.
template <int D>
bool attend(const float* q, const float* kt, const float* v, int64_t heads, int64_t queries, int64_t keys,
            int64_t padded, float scale, float* out) {
  const int64_t blocks = (queries + kRows - 1) / kRows;
  std::atomic<bool> overflow{false};
  at::parallel_for(0, heads * blocks, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> s(kRows * padded);
    float qb[kRows * D], sums[kRows];
    for (int64_t task = begin; task < end && !overflow.load(std::memory_order_relaxed); ++task) {
      const int64_t h = task / blocks, first = task % blocks * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, queries - first));
      for (int r = 0; r < kRows; ++r)
        for (int d = 0; d < D; ++d) qb[r * D + d] = r < rows ? q[((h * queries) + first + r) * D + d] * scale : 0.0f;
      scores<D>(qb, kt + h * D * padded, padded, s.data());
      for (int r = 0; r < kRows; ++r) {
        sums[r] = exponentials(s.data() + r * padded, keys, padded);
        if (r < rows && std::isnan(sums[r])) overflow.store(true, std::memory_order_relaxed);
      }
      weighted_values<D>(s.data(), v + h * padded * D, padded, sums, rows, out + (h * queries + first) * D);
    }
  });
  return !overflow.load();
}

// PyTorch's attention, in the contiguous output the graph typed this node with.
at::Tensor contiguous_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale) {
  return reference_attention(q, k, v, std::nullopt, scale, AttentionLayout::kContiguous);
}

at::Tensor attend_own(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, float s, std::optional<double> scale);

at::Tensor small_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale) {
  auto fits = [](const at::Tensor& t) {
    return t.dim() == 4 && t.scalar_type() == at::kFloat && t.device().is_cpu() && !t.requires_grad();
  };
  if (!cpu_features().avx2_fma || !fits(q) || !fits(k) || !fits(v)) return contiguous_reference(q, k, v, scale);
  const int64_t D = q.size(3), keys = k.size(2);
  if ((D != 8 && D != 16) || k.size(3) != D || v.size(3) != D || v.size(2) != keys || keys == 0 || q.size(0) != k.size(0) ||
      q.size(0) != v.size(0) || q.size(1) != k.size(1) || q.size(1) != v.size(1))
    return contiguous_reference(q, k, v, scale);
  const float s = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2);
  // The kernel, oneDNN's SDPA kernel, or PyTorch's (choice site small_head_attention).
  static choices::Chooser<at::Tensor> chooser("small_head_attention");
  const choices::Key key{batch * heads, choices::bucket(queries), choices::bucket(keys), D};
  auto describe = [&] { return std::pair{std::string("llga::small_head_attention"), c10::str(q.sizes(), " x ", keys, " keys Float")}; };
  return chooser.run(key, describe, [&](size_t i) {
    if (i == 0) return attend_own(q, k, v, s, scale);
    if (i == 1)
      if (auto out = onednn_attention(q, k, v, std::nullopt, scale, AttentionLayout::kContiguous)) return *out;
    return contiguous_reference(q, k, v, scale);
  });
}

at::Tensor attend_own(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, float s, std::optional<double> scale) {
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), D = q.size(3), keys = k.size(2);
  const int64_t padded = (keys + kKeyStep - 1) / kKeyStep * kKeyStep;
  at::Tensor qc = q.contiguous();
  // K^T and V with the keys padded by zeros.
  at::Tensor kt = at::zeros({batch, heads, D, padded}, q.options()), vp = at::zeros({batch, heads, padded, D}, q.options());
  kt.narrow(3, 0, keys).copy_(k.transpose(2, 3));
  vp.narrow(2, 0, keys).copy_(v);
  // NaN or Inf anywhere: PyTorch's kernel says what they become.
  for (const at::Tensor* t : {&qc, &kt, &vp})
    if (!all_finite(t->const_data_ptr<float>(), t->numel())) return contiguous_reference(q, k, v, scale);
  at::Tensor out = at::empty({batch, heads, queries, D}, q.options());
  auto run = D == 8 ? attend<8> : attend<16>;
  bool done = run(qc.const_data_ptr<float>(), kt.const_data_ptr<float>(), vp.const_data_ptr<float>(), batch * heads, queries,
                  keys, padded, s, out.mutable_data_ptr<float>());
  return done ? out : contiguous_reference(q, k, v, scale);
}

torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::small_head_attention(Tensor query, Tensor key, Tensor value, float? scale) -> Tensor",
    [](torch::jit::Stack& stack) {
      RECORD_FUNCTION("llga::small_head_attention", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
      auto scale = torch::jit::pop(stack).toOptional<double>();
      at::Tensor v = torch::jit::pop(stack).toTensor();
      at::Tensor k = torch::jit::pop(stack).toTensor();
      at::Tensor q = torch::jit::pop(stack).toTensor();
      torch::jit::push(stack, small_head_attention(q, k, v, scale));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

bool small_head_attention_runs(int64_t head_size, int64_t keys) {
  return cpu_features().avx2_fma && (head_size == 8 || head_size == 16) && keys >= kSmallHeadAttentionMinKeys;
}

}  // namespace llga
