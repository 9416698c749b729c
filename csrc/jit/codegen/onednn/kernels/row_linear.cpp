// llga::row_linear: x @ weight^T + bias for 1-4 rows of x over a large fp32 or bf16 weight,
// AVX2 + FMA.
//
// A decoder's step multiplies one row by each weight matrix: 2 flops a weight read from memory, so
// the time is the weight's stream, and the kernel's one job is to keep the memory busy. Each
// thread takes a contiguous range of the weight's rows (output features) and reads it as S
// streams, one from each S-th of its range, a row of each at a time: S far-apart sequential reads
// in flight, as a sum over the same bytes has. One stream a thread (a row after the next, as
// oneDNN's and MKL's one-row kernels read) reaches about two thirds of that rate. x's rows stay
// in L1 (as floats); each weight vector read is multiplied into every row of x. A bf16 weight is
// widened as it is read and the sums are fp32, rounded to bf16 once (eager's bf16 linear sums in
// fp32 too): half the bytes a weight. Whether it or PyTorch's linear runs (oneDNN's one-row bf16
// matmuls, where it has bf16 kernels, were faster on some shapes) is measured at the first call of
// each size (choice site row_linear).
// Measured on a 2-core AMD EPYC Zen 3 guest (AVX2), 2 threads, 211 MB of [1536, 576] weights, one
// row, medians of 21 interleaved runs: S = 4 streams 18.2 GB/s (torch.sum over the same bytes 18.3);
// one stream 11.8, MKL's sgemv (torch.mv) 9.1; a decode MLP of such linears through oneDNN's
// matmul partitions ~13.3.
//
// Anything else (another dtype or device, more rows, a CPU without AVX2/FMA, a weight that is not
// a contiguous [out, in] matrix) is at::linear (a bf16 one on a CPU without oneDNN bf16 kernels:
// llga::widened_linear): the same result as eager's, up to the order of the sums.
#include "jit/codegen/onednn/kernels/row_linear.h"
#include "jit/codegen/onednn/settings/choices.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "jit/codegen/onednn/kernels/vector_math.h"
#include "jit/codegen/onednn/kernels/widened_linear.h"
#include "onednn/cpu_features.h"

namespace llga {

namespace {
using namespace vector_math;

// The weight rows each thread takes at least: 64 KB of them (below, a second thread costs more
// than it brings).
constexpr int64_t kMinBytesPerThread = 64 * 1024;

// y[m][s] = x[m] . w[s] for S weight rows and M rows of x (floats, row stride k).
template <int S, int M, typename T>
[[gnu::target("avx2,fma")]] inline void dot_rows(const float* x, int64_t k, const T* const* w, float y[M][S]) {
  __m256 acc[S][M];
  for (auto& a : acc)
    for (auto& r : a) r = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      const __m256 wv = load8(w[s] + i);
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) acc[s][m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * k + i), acc[s][m]);
    }
  }
  if (i < k) {  // the last k % 8 values
    for (int s = 0; s < S; ++s) {
      const __m256 wv = load_tail(w[s] + i, k - i);
      for (int m = 0; m < M; ++m) acc[s][m] = _mm256_fmadd_ps(wv, load_tail(x + m * k + i, k - i), acc[s][m]);
    }
  }
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < M; ++m) y[m][s] = horizontal_sum(acc[s][m]);
}

// out[m][j] = x[m] . weight[j] + bias[j] for j in [begin, end), as S streams over the range.
template <int S, int M, typename T>
[[gnu::target("avx2,fma")]] void rows_range(const float* x, const T* weight, const T* bias, int64_t n, int64_t k,
                                            int64_t begin, int64_t end, T* out) {
  const int64_t part = (end - begin + S - 1) / S;  // rows of each stream; the last one's may be fewer
  for (int64_t i = 0; i < part; ++i) {
    const T* w[S];
    int64_t row[S];
    for (int s = 0; s < S; ++s) {
      row[s] = begin + s * part + i;
      w[s] = weight + std::min(row[s], end - 1) * k;  // past the range: a row read again, its result dropped
    }
    float y[M][S];
    dot_rows<S, M>(x, k, w, y);
    for (int s = 0; s < S; ++s) {
      if (row[s] >= end) continue;
      const float b = bias ? static_cast<float>(bias[row[s]]) : 0.0f;
      for (int m = 0; m < M; ++m) out[m * n + row[s]] = static_cast<T>(y[m][s] + b);
    }
  }
}

template <int M, typename T>
void run_rows(const float* x, const T* weight, const T* bias, int64_t n, int64_t k, T* out) {
  // Four streams; three for 3-4 rows (S x M accumulators and a weight and an x register: 16).
  constexpr int S = M <= 2 ? 4 : 3;
  const int64_t grain = std::max<int64_t>(1, kMinBytesPerThread / (k * static_cast<int64_t>(sizeof(T))));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { rows_range<S, M>(x, weight, bias, n, k, begin, end, out); });
}

// Whether the kernel takes x @ weight^T + bias: fp32 or bf16 (all three alike) on the CPU, a
// contiguous [out, in] weight.
bool fits(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const auto dtype = x.scalar_type();
  const bool fit = cpu_features().avx2_fma && (dtype == at::kFloat || dtype == at::kBFloat16) && x.device().is_cpu() &&
                   x.dim() >= 1 && !x.requires_grad() && weight.scalar_type() == dtype && weight.device().is_cpu() &&
                   weight.dim() == 2 && weight.is_contiguous() && !weight.requires_grad() &&
                   x.size(-1) == weight.size(1) && weight.size(1) > 0 &&
                   (!bias || (bias->scalar_type() == dtype && bias->device().is_cpu() && bias->dim() == 1 &&
                              bias->size(0) == weight.size(0) && bias->is_contiguous() && !bias->requires_grad()));
  if (!fit) return false;
  const int64_t rows = x.numel() / x.size(-1);
  return rows >= 1 && rows <= kRowLinearMaxRows;
}

// x's rows as floats ([rows, k], contiguous) @ weight^T + bias, in x's sizes but the last (n) and dtype.
template <typename T>
at::Tensor linear_rows(const at::Tensor& x, const float* rows_data, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias) {
  const int64_t n = weight.size(0), k = weight.size(1), rows = x.numel() / k;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = n;
  at::Tensor out = at::empty(sizes, x.options());
  const T* wp = weight.const_data_ptr<T>();
  const T* bp = bias ? bias->const_data_ptr<T>() : nullptr;
  T* op = out.mutable_data_ptr<T>();
  switch (rows) {
    case 1: run_rows<1>(rows_data, wp, bp, n, k, op); break;
    case 2: run_rows<2>(rows_data, wp, bp, n, k, op); break;
    case 3: run_rows<3>(rows_data, wp, bp, n, k, op); break;
    default: run_rows<4>(rows_data, wp, bp, n, k, op); break;
  }
  return out;
}

// x's rows as contiguous floats (bf16 ones widened: 1-4 rows), then the kernel in x's dtype.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const at::Tensor xr = x.contiguous();
  if (x.scalar_type() == at::kFloat) return linear_rows<float>(x, xr.const_data_ptr<float>(), weight, bias);
  const c10::BFloat16* p = xr.const_data_ptr<c10::BFloat16>();
  const std::vector<float> rows(p, p + xr.numel());
  return linear_rows<c10::BFloat16>(x, rows.data(), weight, bias);
}

// The key and record of a choice over x's rows and this weight.
choices::Key key_of(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return {x.numel() / x.size(-1), weight.size(0), weight.size(1), static_cast<int64_t>(x.scalar_type()), bias.has_value()};
}
auto describer(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  return [op, &x, &weight] {
    return std::pair{std::string(op), c10::str(x.numel() / x.size(-1), " rows x ", weight.sizes(), " ", x.scalar_type())};
  };
}

at::Tensor row_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  // Else at::linear (widened_linear: for bf16 on a CPU without oneDNN bf16 kernels, widened).
  if (!fits(x, weight, bias)) return widened_linear(x, weight, bias);
  // The kernel, or PyTorch's linear (oneDNN's or MKL's): which streams the weight faster differs
  // between CPUs and dtypes (choice site row_linear).
  static choices::Chooser<at::Tensor> chooser("row_linear");
  return chooser.run(key_of(x, weight, bias), describer("llga::row_linear", x, weight),
                     [&](size_t i) { return i == 0 ? linear_rows(x, weight, bias) : at::linear(x, weight, bias); });
}

// out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * norm_weight as floats, in at::rms_norm's order
// of operations: fp32 sums; in bf16 the normalized row rounded to bf16, then multiplied by the
// weight and rounded again (Llama's RMSNorm, which ComposeRmsNorm makes an aten::rms_norm, does the same).
template <typename T>
[[gnu::target("avx2,fma")]] void rms_normalize(const T* x, int64_t rows, int64_t k, const T* norm_weight, float eps,
                                              float* out) {
  for (int64_t r = 0; r < rows; ++r, x += k, out += k) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      const __m256 v = load8(x + i);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    float squares = horizontal_sum(acc);
    for (; i < k; ++i) squares += static_cast<float>(x[i]) * static_cast<float>(x[i]);
    const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(k) + eps);
    for (i = 0; i < k; ++i) {  // T(...): the rounding to bf16 (none for fp32)
      const float normalized = static_cast<float>(T(static_cast<float>(x[i]) * inverse));
      out[i] = norm_weight ? static_cast<float>(T(normalized * static_cast<float>(norm_weight[i]))) : normalized;
    }
  }
}

template <typename T>
at::Tensor normalized_linear_rows(const at::Tensor& x, const std::optional<at::Tensor>& norm_weight, float eps,
                                  const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const at::Tensor xr = x.contiguous();
  const int64_t k = weight.size(1), rows = x.numel() / k;
  std::vector<float> normalized(rows * k);
  rms_normalize<T>(xr.const_data_ptr<T>(), rows, k, norm_weight ? norm_weight->const_data_ptr<T>() : nullptr, eps,
                   normalized.data());
  return linear_rows<T>(x, normalized.data(), weight, bias);
}

// rms_norm(x, [in], norm_weight, eps) @ weight^T + bias: the normalization of a few rows is the
// linear's prologue (its own oneDNN partition, or PyTorch's bf16 one, cost more than the linear's
// math on them).
at::Tensor rms_norm_row_linear(const at::Tensor& x, const std::optional<at::Tensor>& norm_weight, std::optional<double> eps,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const bool norm_fits = !norm_weight || (norm_weight->scalar_type() == x.scalar_type() && norm_weight->device().is_cpu() &&
                                          norm_weight->dim() == 1 && norm_weight->size(0) == weight.size(1) &&
                                          norm_weight->is_contiguous() && !norm_weight->requires_grad());
  if (!fits(x, weight, bias) || !norm_fits) return row_linear(at::rms_norm(x, {x.size(-1)}, norm_weight, eps), weight, bias);
  const float e = static_cast<float>(eps ? *eps : std::numeric_limits<float>::epsilon());
  static choices::Chooser<at::Tensor> chooser("rms_norm_row_linear");
  return chooser.run(key_of(x, weight, bias), describer("llga::rms_norm_row_linear", x, weight), [&](size_t i) {
    if (i == 1) return at::linear(at::rms_norm(x, {x.size(-1)}, norm_weight, eps), weight, bias);
    return x.scalar_type() == at::kFloat ? normalized_linear_rows<float>(x, norm_weight, e, weight, bias)
                                         : normalized_linear_rows<c10::BFloat16>(x, norm_weight, e, weight, bias);
  });
}

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        "llga::row_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
        [](torch::jit::Stack& stack) {
          RECORD_FUNCTION("llga::row_linear", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
          auto bias = torch::jit::pop(stack).toOptional<at::Tensor>();
          at::Tensor weight = torch::jit::pop(stack).toTensor();
          at::Tensor x = torch::jit::pop(stack).toTensor();
          torch::jit::push(stack, row_linear(x, weight, bias));
        },
        c10::AliasAnalysisKind::FROM_SCHEMA),
    torch::jit::Operator(
        "llga::rms_norm_row_linear(Tensor x, Tensor? norm_weight, float? eps, Tensor weight, Tensor? bias) -> Tensor",
        [](torch::jit::Stack& stack) {
          RECORD_FUNCTION("llga::rms_norm_row_linear", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
          auto bias = torch::jit::pop(stack).toOptional<at::Tensor>();
          at::Tensor weight = torch::jit::pop(stack).toTensor();
          auto eps = torch::jit::pop(stack).toOptional<double>();
          auto norm_weight = torch::jit::pop(stack).toOptional<at::Tensor>();
          at::Tensor x = torch::jit::pop(stack).toTensor();
          torch::jit::push(stack, rms_norm_row_linear(x, norm_weight, eps, weight, bias));
        },
        c10::AliasAnalysisKind::FROM_SCHEMA),
});

}  // namespace

bool row_linear_runs(int64_t rows, int64_t out_features, int64_t in_features) {
  return cpu_features().avx2_fma && rows >= 1 && rows <= kRowLinearMaxRows &&
         out_features * in_features >= kRowLinearMinWeights;
}

}  // namespace llga
