// llga::layer_norm (layer_norm.h). Each row: its mean, then the mean of its squared deviations
// from it (two passes over a row in L1: no cancellation, as PyTorch's Welford has none), then
// (x - mean) / sqrt(var + eps) * weight + bias. Rows split between PyTorch's intra-op threads.
// PyTorch's and oneDNN's kernels compute the same quantities in other orders: outputs agree to
// float rounding (test_pt2e.py checks 1e-5 against eager's).
#include "jit/codegen/onednn/kernels/layer_norm.h"

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/settings/choices.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <cmath>

#include "jit/codegen/onednn/kernels/vector_math.h"
#include "onednn/cpu_features.h"

namespace llga {

namespace {

using vector_math::horizontal_sum;
using vector_math::load8;
using vector_math::load_tail;

[[gnu::target("avx2,fma")]] void normalize_row(const float* x, float* y, int64_t n, const float* weight, const float* bias,
                                               float eps) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_add_ps(s0, load8(x + i));
    s1 = _mm256_add_ps(s1, load8(x + i + 8));
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_add_ps(s0, load8(x + i));
  if (i < n) s1 = _mm256_add_ps(s1, load_tail(x + i, n - i));
  const float mean = horizontal_sum(_mm256_add_ps(s0, s1)) / static_cast<float>(n);

  const __m256 m = _mm256_set1_ps(mean);
  __m256 v0 = _mm256_setzero_ps(), v1 = _mm256_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(load8(x + i), m), d1 = _mm256_sub_ps(load8(x + i + 8), m);
    v0 = _mm256_fmadd_ps(d0, d0, v0);
    v1 = _mm256_fmadd_ps(d1, d1, v1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(load8(x + i), m);
    v0 = _mm256_fmadd_ps(d, d, v0);
  }
  float tail = 0.0f;
  for (int64_t j = i; j < n; ++j) tail += (x[j] - mean) * (x[j] - mean);
  const float var = (horizontal_sum(_mm256_add_ps(v0, v1)) + tail) / static_cast<float>(n);
  const float rstd = 1.0f / std::sqrt(var + eps);

  const __m256 r = _mm256_set1_ps(rstd);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_sub_ps(load8(x + i), m), r);
    if (weight) v = _mm256_mul_ps(v, load8(weight + i));
    if (bias) v = _mm256_add_ps(v, load8(bias + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) {
    float v = (x[i] - mean) * rstd;
    if (weight) v *= weight[i];
    if (bias) v += bias[i];
    y[i] = v;
  }
}

// A weight or bias the kernel reads: absent, or n dense fp32 values.
bool parameter_fits(const std::optional<at::Tensor>& p, int64_t n) {
  return !p || !p->defined() ||
         (p->device().is_cpu() && p->scalar_type() == at::kFloat && p->is_contiguous() && p->numel() == n);
}

const float* data_or_null(const std::optional<at::Tensor>& p) {
  return p && p->defined() ? p->const_data_ptr<float>() : nullptr;
}

at::Tensor normalized_rows(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                           double eps);

at::Tensor normalized(const at::Tensor& input, c10::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  // A group's output read by this op is strided (layout_propagation.cpp: only groups read LLGA tensors).
  TORCH_INTERNAL_ASSERT(!is_llga_tensor(input), "llga::layer_norm was given a tensor in oneDNN's layout");
  const at::Tensor& x = input;
  const int64_t n = x.dim() ? x.size(-1) : 0;
  if (!own_layer_norm_runs() || !x.device().is_cpu() || x.scalar_type() != at::kFloat || x.layout() != c10::kStrided ||
      !x.is_contiguous() || x.requires_grad() || normalized_shape.size() != 1 || normalized_shape[0] != n || n == 0 ||
      !parameter_fits(weight, n) || !parameter_fits(bias, n))
    return at::layer_norm(x, normalized_shape, weight, bias, eps);  // and its own errors
  // The kernel, or PyTorch's (choice site layer_norm).
  static choices::Chooser<at::Tensor> chooser("layer_norm");
  const choices::Key key{choices::bucket(x.numel() / n), n, weight.has_value() && weight->defined(), bias.has_value() && bias->defined()};
  auto describe = [&] { return std::pair{std::string("llga::layer_norm"), c10::str(x.sizes(), " Float")}; };
  return chooser.run(key, describe, [&](size_t i) {
    return i == 0 ? normalized_rows(x, weight, bias, eps) : at::layer_norm(x, normalized_shape, weight, bias, eps);
  });
}

at::Tensor normalized_rows(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                           double eps) {
  const int64_t n = x.size(-1);
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const float* src = x.const_data_ptr<float>();
  float* dst = y.mutable_data_ptr<float>();
  const float *w = data_or_null(weight), *b = data_or_null(bias);
  const auto e = static_cast<float>(eps);
  const int64_t rows = x.numel() / n;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) normalize_row(src + r * n, dst + r * n, n, w, b, e);
  });
  return y;
}

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        "llga::layer_norm(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> Tensor",
        [](torch::jit::Stack& stack) {
          RECORD_FUNCTION("llga::layer_norm", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
          double eps = torch::jit::pop(stack).toDouble();
          auto bias = torch::jit::pop(stack).toOptional<at::Tensor>();
          auto weight = torch::jit::pop(stack).toOptional<at::Tensor>();
          std::vector<int64_t> shape = torch::jit::pop(stack).toIntVector();
          at::Tensor x = torch::jit::pop(stack).toTensor();
          torch::jit::push(stack, normalized(x, shape, weight, bias, eps));
        },
        c10::AliasAnalysisKind::FROM_SCHEMA),
});

}  // namespace

bool own_layer_norm_runs() { return cpu_features().avx2_fma; }

}  // namespace llga
