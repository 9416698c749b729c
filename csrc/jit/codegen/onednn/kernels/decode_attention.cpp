// llga::decode_attention: a decoder step's attention over its KV cache, fp32 or bf16 (widened as
// read, computed in fp32, rounded once), heads of 64 or 128, AVX2 + FMA.
//
// At one query a head, attention is a pass over the cache: each key's score (a 64-long dot
// product), the softmax of the row, the values weighted. PyTorch's path for it costs more than the
// pass: transformers copies the cache's K and V n times a layer to give every query head its own
// (repeat_kv: SmolLM2-135M's 3 KV heads for 9 query heads, 2 x 368 KB a layer at 160 positions),
// then the flash kernel's blocking is set up for one row. This kernel reads the cache in place, all
// query heads of a KV head (n x queries rows) one after another against its K and V (L2-resident).
// Per row: the scores (scaled, the mask added) in a buffer, exp(score - max) with the attention
// kernels' exponential (vector_math.h), then the values weighted in registers.
// Measured on generate() of a SmolLM2-135M-shaped Llama (fp32, static cache of 160-256 positions,
// 2 threads, AMD EPYC Zen 3): see BENCHMARKS.md.
//
// Anything else (another dtype, head size or layout, NaN or Inf reaching a score or the output,
// a fully masked row) is PyTorch's scaled_dot_product_attention on the repeated heads: eager's result.
#include "jit/codegen/onednn/kernels/decode_attention.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "jit/codegen/onednn/kernels/reference_attention.h"
#include "jit/codegen/onednn/kernels/finite_scan.h"
#include "jit/codegen/onednn/kernels/vector_math.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/cpu_features.h"

namespace llga {

namespace {
using namespace vector_math;

// The key or value eager attends to: source's heads repeated (source.unsqueeze(2).expand(expanded)
// .reshape(shape), transformers' repeat_kv, a copy), or source itself.
at::Tensor as_eager(const at::Tensor& source, const std::optional<c10::IntArrayRef>& expanded,
                    const std::optional<c10::IntArrayRef>& shape) {
  return expanded && shape ? source.unsqueeze(2).expand(*expanded).reshape(*shape) : source;
}

// How many times expanded and shape repeat each of source's heads ([B, Hkv, L, D] -> [B, Hkv, n, L, D]
// -> [B, Hkv * n, L, D]); 1 without them, 0 where they do something else.
int64_t repeats(const at::Tensor& source, const std::optional<c10::IntArrayRef>& expanded,
                const std::optional<c10::IntArrayRef>& shape) {
  if (!expanded || !shape) return 1;
  if (source.dim() != 4 || expanded->size() != 5 || shape->size() != 4) return 0;
  const auto s = source.sizes();
  const std::vector<int64_t> unsqueezed = {s[0], s[1], 1, s[2], s[3]};
  std::vector<int64_t> e(5);
  for (int i = 0; i < 5; ++i) e[i] = (*expanded)[i] == -1 ? unsqueezed[i] : (*expanded)[i];
  if (e[0] != s[0] || e[1] != s[1] || e[3] != s[2] || e[4] != s[3] || e[2] < 1) return 0;
  const int64_t numel = source.numel() * e[2];
  for (int64_t d : *shape)
    if (d < -1) return 0;
  if (std::count(shape->begin(), shape->end(), -1) > 1) return 0;
  int64_t known = 1;
  for (int64_t d : *shape) known *= d == -1 ? 1 : d;
  std::vector<int64_t> r(shape->begin(), shape->end());
  for (auto& d : r)
    if (d == -1) d = known == 0 ? 0 : numel / known;
  return r == std::vector<int64_t>{s[0], s[1] * e[2], s[2], s[3]} ? e[2] : 0;
}

// Whether any of the n floats is NaN (-inf and inf are not).
[[gnu::target("avx2,fma")]] bool any_nan(const float* x, int64_t n) {
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  bool found = _mm256_movemask_ps(nan) != 0;
  for (; i < n; ++i) found = found || std::isnan(x[i]);
  return found;
}

// One query row: out = softmax(q . K^T * scale + mask) V over `keys` rows of K and V (row stride
// kv_stride); mask (nullptr: none) holds a float per key. `s` has room for the keys padded to 16.
// Returns false where the row is not for this kernel (NaN in a score, no finite maximum, a
// non-finite output).
template <int D, typename T>
[[gnu::target("avx2,fma")]] bool attend_row(const T* q, const T* k, const T* v, int64_t kv_stride, int64_t keys,
                                            const float* mask, float scale, float* s, T* out) {
  __m256 qv[D / 8];
#pragma GCC unroll 16
  for (int d = 0; d < D / 8; ++d) qv[d] = _mm256_mul_ps(load8(q + 8 * d), _mm256_set1_ps(scale));
  for (int64_t j = 0; j < keys; ++j) {
    const T* kj = k + j * kv_stride;
    __m256 a0 = _mm256_mul_ps(qv[0], load8(kj)), a1 = _mm256_mul_ps(qv[1], load8(kj + 8));
#pragma GCC unroll 16
    for (int d = 2; d < D / 8; d += 2) {
      a0 = _mm256_fmadd_ps(qv[d], load8(kj + 8 * d), a0);
      a1 = _mm256_fmadd_ps(qv[d + 1], load8(kj + 8 * d + 8), a1);
    }
    s[j] = horizontal_sum(_mm256_add_ps(a0, a1)) + (mask ? mask[j] : 0.0f);
  }
  if (any_nan(s, keys)) return false;
  const int64_t padded = (keys + 15) / 16 * 16;
  const float sum = exponentials(s, keys, padded);
  if (!std::isfinite(sum)) return false;  // no finite maximum: a fully masked row, or overflow
  __m256 acc[D / 8];
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t j = 0; j < keys; ++j) {
    const __m256 p = _mm256_broadcast_ss(s + j);
    const T* vj = v + j * kv_stride;
#pragma GCC unroll 16
    for (int d = 0; d < D / 8; ++d) acc[d] = _mm256_fmadd_ps(p, load8(vj + 8 * d), acc[d]);
  }
  const __m256 inverse = _mm256_set1_ps(1.0f / sum);
  alignas(32) float row[D];
#pragma GCC unroll 16
  for (int d = 0; d < D / 8; ++d) _mm256_store_ps(row + 8 * d, _mm256_mul_ps(acc[d], inverse));
  if (!all_finite(row, D)) return false;
  for (int d = 0; d < D; ++d) out[d] = static_cast<T>(row[d]);
  return true;
}

// q [B, H, Lq, D], k and v [B, Hkv, L, D] (rows contiguous), mask [B, H, Lq, L] of floats (keys
// contiguous; broadcast dims stride 0) or undefined; out [B, H, Lq, D] contiguous.
template <int D, typename T>
bool attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, float scale, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), kv_heads = k.size(1), keys = k.size(2);
  const int64_t n = heads / kv_heads;
  const T *qp = q.const_data_ptr<T>(), *kp = k.const_data_ptr<T>(), *vp = v.const_data_ptr<T>();
  const float* mp = mask.defined() ? mask.const_data_ptr<float>() : nullptr;
  T* op = out.mutable_data_ptr<T>();
  std::atomic<bool> ok{true};
  // A KV head's rows a task; split over the threads only where the cache is long enough to pay.
  const int64_t grain = keys * D * n * queries >= 64 * 1024 ? 1 : batch * kv_heads;
  at::parallel_for(0, batch * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> s((keys + 15) / 16 * 16);
    for (int64_t bg = begin; bg < end && ok.load(std::memory_order_relaxed); ++bg) {
      const int64_t b = bg / kv_heads, g = bg % kv_heads;
      const T* kh = kp + b * k.stride(0) + g * k.stride(1);
      const T* vh = vp + b * v.stride(0) + g * v.stride(1);
      for (int64_t h = g * n; h < (g + 1) * n; ++h)
        for (int64_t i = 0; i < queries; ++i) {
          const T* qi = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
          const float* mi = mp ? mp + b * mask.stride(0) + h * mask.stride(1) + i * mask.stride(2) : nullptr;
          T* oi = op + ((b * heads + h) * queries + i) * D;
          if (!attend_row<D>(qi, kh, vh, k.stride(2), keys, mi, scale, s.data(), oi)) {
            ok.store(false, std::memory_order_relaxed);
            return;
          }
        }
    }
  });
  return ok.load();
}

// k and v: [B, Hkv, L, D] caches whose heads eager repeats (k_expanded, k_shape: repeat_kv's sizes),
// or the keys and values themselves (no sizes).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask, std::optional<double> scale,
                            const std::optional<c10::IntArrayRef>& k_expanded, const std::optional<c10::IntArrayRef>& k_shape,
                            const std::optional<c10::IntArrayRef>& v_expanded, const std::optional<c10::IntArrayRef>& v_shape) {
  const auto dtype = q.scalar_type();
  auto fits = [dtype](const at::Tensor& t) {
    return t.dim() == 4 && (dtype == at::kFloat || dtype == at::kBFloat16) && t.scalar_type() == dtype &&
           t.device().is_cpu() && !t.requires_grad() && t.stride(3) == 1;
  };
  // in the output's strides the graph was typed with (contiguous)
  auto eager = [&] {
    return reference_attention(q, as_eager(k, k_expanded, k_shape), as_eager(v, v_expanded, v_shape), mask, scale,
                               AttentionLayout::kContiguous);
  };
  const int64_t n = repeats(k, k_expanded, k_shape);
  const int64_t d = q.dim() == 4 ? q.size(3) : 0;
  bool ok = cpu_features().avx2_fma && n > 0 && repeats(v, v_expanded, v_shape) == n && fits(q) && fits(k) && fits(v) &&
            decode_attention_runs(d, q.size(2)) && k.size(3) == d && v.size(3) == d && k.size(0) == q.size(0) &&
            v.size(0) == q.size(0) && k.size(1) == v.size(1) && k.size(1) * n == q.size(1) && k.size(2) == v.size(2) &&
            k.size(2) > 0 && k.stride(2) == v.stride(2);
  at::Tensor additive;
  if (ok && mask) {  // broadcast to [B, H, Lq, L] (a view), as floats to add
    ok = mask->dim() <= 4 && mask->device().is_cpu() &&
         (mask->scalar_type() == dtype || mask->scalar_type() == at::kBool) &&
         at::is_expandable_to(mask->sizes(), {q.size(0), q.size(1), q.size(2), k.size(2)});
    if (ok) {
      const auto floats = q.options().dtype(at::kFloat);
      additive = mask->scalar_type() == at::kBool
                     ? at::where(*mask, at::zeros({}, floats), at::full({}, -std::numeric_limits<float>::infinity(), floats))
                     : mask->to(at::kFloat);
      additive = additive.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
      if (additive.stride(3) != 1) additive = additive.contiguous();
    }
  }
  if (!ok) return eager();
  const float s = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d)));
  auto own = [&] {
    at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), d}, q.options());
    const bool done = dtype == at::kFloat
                          ? (d == 64 ? attend<64, float>(q, k, v, additive, s, out) : attend<128, float>(q, k, v, additive, s, out))
                          : (d == 64 ? attend<64, c10::BFloat16>(q, k, v, additive, s, out)
                                     : attend<128, c10::BFloat16>(q, k, v, additive, s, out));
    return done ? out : eager();
  };
  // The kernel (grouped heads read in place), or PyTorch's attention over the repeated heads
  // (choice site decode_attention); the cache's length by its power-of-two bucket.
  static choices::Chooser<at::Tensor> chooser("decode_attention");
  const choices::Key key{static_cast<int64_t>(dtype), q.size(0), q.size(1), q.size(2), d, n, choices::bucket(k.size(2)),
                         mask.has_value()};
  auto describe = [&] {
    return std::pair{std::string("llga::decode_attention"),
                     c10::str(q.sizes(), " over ", k.size(2), " cached ", dtype, n > 1 ? c10::str(", heads shared by ", n) : "")};
  };
  return chooser.run(key, describe, [&](size_t i) { return i == 0 ? own() : eager(); });
}

torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::decode_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float? scale, int[]? key_expanded, "
    "int[]? key_shape, int[]? value_expanded, int[]? value_shape) -> Tensor",
    [](torch::jit::Stack& stack) {
      RECORD_FUNCTION("llga::decode_attention", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
      auto list = [](const c10::IValue& i) {
        return i.isNone() ? std::nullopt : std::optional<std::vector<int64_t>>(i.toIntVector());
      };
      auto v_shape = list(torch::jit::pop(stack)), v_expanded = list(torch::jit::pop(stack));
      auto k_shape = list(torch::jit::pop(stack)), k_expanded = list(torch::jit::pop(stack));
      auto scale = torch::jit::pop(stack).toOptional<double>();
      auto mask = torch::jit::pop(stack).toOptional<at::Tensor>();
      at::Tensor v = torch::jit::pop(stack).toTensor();
      at::Tensor k = torch::jit::pop(stack).toTensor();
      at::Tensor q = torch::jit::pop(stack).toTensor();
      auto ref = [](const std::optional<std::vector<int64_t>>& l) {
        return l ? std::optional<c10::IntArrayRef>(*l) : std::nullopt;
      };
      torch::jit::push(stack, decode_attention(q, k, v, mask, scale, ref(k_expanded), ref(k_shape), ref(v_expanded), ref(v_shape)));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

bool decode_attention_runs(int64_t head_size, int64_t queries) {
  return cpu_features().avx2_fma && (head_size == 64 || head_size == 128) && queries >= 1 &&
         queries <= kDecodeAttentionMaxQueries;
}

}  // namespace llga
