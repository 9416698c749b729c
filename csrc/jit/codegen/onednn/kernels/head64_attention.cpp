// llga::head64_attention: softmax(q k^T * scale) v for heads of 64 values, 96+ queries over 128+
// keys, fp32, on AVX2 + FMA (Whisper's encoder: 6 heads of 64 over 1,500 positions; ViT-B/16's 12
// over 197).
//
// Here the two matmuls are the work (64 multiply-adds a score in each, one exponential), so the
// kernel is two register-blocked gemms with the softmax between them, 24 query rows at a time:
//   1. the block's scores against 16 keys at a time: for each key tile (K^T's 64 x 16, in L1), four
//      groups of six rows, each a 6 x 16 tile in twelve accumulators (two loads and six broadcasts
//      a twelve multiply-adds);
//   2. each row's maximum, exp(score - max) in place and its sum (vector_math.h);
//   3. the values weighted by the probabilities, 256 keys at a time (their V rows in L2): for each
//      16-wide slice of the 64 values, the four six-row groups, again a 6 x 16 tile a step.
// The block's scores (24 x keys floats) stay in L2; K^T, packed by key tiles, is read once a block. Rows past
// the queries' end are zeros whose results are dropped; keys are padded to 16 for step 1 only
// (their scores -inf). q and v are read through their strides (the transposed views of a
// projection's output that models pass need no copy); K^T is a packed copy made per call. The
// output is written in [B, L, H, D] memory where the graph merges its heads next.
//
// Anything else (other head sizes, dtypes, a CPU without AVX2/FMA, NaN or Inf in q, k or v, scores
// that overflow) is PyTorch's scaled_dot_product_attention: the same result as eager.
#include "jit/codegen/onednn/kernels/head64_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "jit/codegen/onednn/kernels/vector_math.h"

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

// out [batch, heads, queries, D] (through its strides: `o`) from q and v through theirs and kt, K^T
// packed by key tiles. False where some row's scores overflowed.
bool attend(Operand q, const float* kt, Operand v, int64_t batch, int64_t heads, int64_t queries, int64_t keys,
            int64_t padded, float scale, Operand o, float* out) {
  const int64_t blocks = (queries + kBlockRows - 1) / kBlockRows;
  std::atomic<bool> overflow{false};
  at::parallel_for(0, batch * heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(kBlockRows * padded);
    alignas(32) float qb[kBlockRows * D], ob[kBlockRows * D];
    float sums[kBlockRows];
    for (int64_t task = begin; task < end && !overflow.load(std::memory_order_relaxed); ++task) {
      const int64_t bh = task / blocks, b = bh / heads, h = bh % heads, first = task % blocks * kBlockRows;
      const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, queries - first));
      for (int r = 0; r < kBlockRows; ++r) {
        const float* row = r < rows ? q.row(b, h, first + r) : nullptr;
        for (int d = 0; d < D; ++d) qb[r * D + d] = row ? row[d] * scale : 0.0f;
      }
      const float* kth = kt + bh * padded * D;
      for (int64_t j = 0; j < padded; j += kKeyTile)
        for (int g = 0; g < kGroups; ++g)
          score_tile(qb + g * kTileRows * D, kth + j * D, padded, s.data() + g * kTileRows * padded + j);
      for (int r = 0; r < kBlockRows; ++r) {
        sums[r] = exponentials(s.data() + r * padded, keys, padded);
        if (r < rows && std::isnan(sums[r])) overflow.store(true, std::memory_order_relaxed);
      }
      std::fill(std::begin(ob), std::end(ob), 0.0f);
      const float* vh = v.row(b, h, 0);
      for (int64_t j = 0; j < keys; j += kKeyChunk) {
        const int64_t n = std::min(kKeyChunk, keys - j);
        for (int c = 0; c < D; c += kKeyTile)
          for (int g = 0; g < kGroups; ++g)
            value_tile(s.data() + g * kTileRows * padded + j, padded, vh + j * v.row_stride + c, v.row_stride, n,
                       ob + g * kTileRows * D + c);
      }
      for (int r = 0; r < rows; ++r) {
        float* row = out + (o.row(b, h, first + r) - o.data);
        const float inv = 1.0f / sums[r];
        for (int d = 0; d < D; ++d) row[d] = ob[r * D + d] * inv;
      }
    }
  });
  return !overflow.load();
}

// An empty output: [B, L, H, D] memory where the heads are merged next (see head64_attention()).
at::Tensor empty_output(c10::IntArrayRef sizes, const at::TensorOptions& options, bool merged_heads) {
  if (!merged_heads) return at::empty(sizes, options);
  return at::empty({sizes[0], sizes[2], sizes[1], sizes[3]}, options).transpose(1, 2);
}

// PyTorch's attention, in the kernel's output layout where it is 4-D, so that a call the kernel
// does not take gives the strides the graph was typed with.
at::Tensor pytorch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                             bool merged_heads) {
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, false, scale);
  if (out.dim() != 4 || !merged_heads) return out;
  return at::empty({out.size(0), out.size(2), out.size(1), out.size(3)}, out.options()).transpose(1, 2).copy_(out);
}

Operand operand(const at::Tensor& t) {
  return {t.const_data_ptr<float>(), t.stride(0), t.stride(1), t.stride(2)};
}

// Whether every float a [batch, heads, rows, D] view reads is finite.
bool view_finite(const at::Tensor& t) {
  if (t.is_contiguous()) return all_finite(t.const_data_ptr<float>(), t.numel());
  const Operand o = operand(t);
  for (int64_t b = 0; b < t.size(0); ++b)
    for (int64_t h = 0; h < t.size(1); ++h)
      for (int64_t i = 0; i < t.size(2); ++i)
        if (!all_finite(o.row(b, h, i), D)) return false;
  return true;
}

// merged_heads: the output is written in [B, L, H, D] memory (its heads are merged next, by a
// transpose(1, 2): that and the reshape after it are then views); else contiguous.
at::Tensor head64_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                            bool merged_heads) {
  auto fits = [](const at::Tensor& t) {
    return t.dim() == 4 && t.scalar_type() == at::kFloat && t.device().is_cpu() && !t.requires_grad() && t.size(3) == D;
  };
  if (!cpu_has_avx2_fma() || !fits(q) || !fits(k) || !fits(v)) return pytorch_attention(q, k, v, scale, merged_heads);
  const int64_t keys = k.size(2);
  if (v.size(2) != keys || keys == 0 || q.size(0) != k.size(0) || q.size(0) != v.size(0) || q.size(1) != k.size(1) ||
      q.size(1) != v.size(1))
    return pytorch_attention(q, k, v, scale, merged_heads);
  const float s = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2);
  const int64_t padded = (keys + kKeyTile - 1) / kKeyTile * kKeyTile;
  // q and v read in place where their rows are contiguous (a transposed view of [B, L, H, D] is).
  const at::Tensor qr = q.stride(3) == 1 ? q : q.contiguous(), vr = v.stride(3) == 1 ? v : v.contiguous();
  // K^T packed by key tiles, [batch * heads, padded / 16, D, 16]: a tile's 4 KB contiguous.
  at::Tensor kt = at::empty({batch * heads, padded / kKeyTile, D, kKeyTile}, q.options());
  {
    const at::Tensor kr = k.stride(3) == 1 ? k : k.contiguous();
    const Operand ko = operand(kr);
    float* dst = kt.mutable_data_ptr<float>();
    at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh)
        for (int64_t j = 0; j < padded; ++j) {  // the padding keys zero (their scores are set to -inf)
          const float* row = j < keys ? ko.row(bh / heads, bh % heads, j) : nullptr;
          float* tile = dst + (bh * padded + j / kKeyTile * kKeyTile) * D + j % kKeyTile;
          for (int d = 0; d < D; ++d) tile[d * kKeyTile] = row ? row[d] : 0.0f;
        }
    });
  }
  // NaN or Inf anywhere: PyTorch's kernel says what they become.
  if (!view_finite(qr) || !view_finite(vr) || !all_finite(kt.const_data_ptr<float>(), kt.numel()))
    return pytorch_attention(q, k, v, scale, merged_heads);
  at::Tensor out = empty_output({batch, heads, queries, D}, q.options(), merged_heads);
  bool done = attend(operand(qr), kt.const_data_ptr<float>(), operand(vr), batch, heads, queries, keys, padded, s,
                     operand(out), out.mutable_data_ptr<float>());
  return done ? out : pytorch_attention(q, k, v, scale, merged_heads);
}

torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::head64_attention(Tensor query, Tensor key, Tensor value, float? scale, bool merged_heads) -> Tensor",
    [](torch::jit::Stack& stack) {
      bool merged_heads = torch::jit::pop(stack).toBool();
      auto scale = torch::jit::pop(stack).toOptional<double>();
      at::Tensor v = torch::jit::pop(stack).toTensor();
      at::Tensor k = torch::jit::pop(stack).toTensor();
      at::Tensor q = torch::jit::pop(stack).toTensor();
      torch::jit::push(stack, head64_attention(q, k, v, scale, merged_heads));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

bool head64_attention_runs(int64_t head_size, int64_t queries, int64_t keys) {
  return vector_math::cpu_has_avx2_fma() && head_size == D && queries >= kHead64AttentionMinQueries &&
         keys >= kHead64AttentionMinKeys;
}

}  // namespace llga
