// llga::softmax_inf_as_zero, llga::attention_bias, llga::sdpa_scale (attention_ops.h).
#include "jit/codegen/onednn/kernels/attention_ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/util/bit_cast.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "jit/codegen/onednn/mapping/onednn_quirks.h"

namespace llga {

namespace {

// softmax(x, dim), but 0 for rows of only -inf (PyTorch's SDPA masks fully masked rows to 0;
// oneDNN's SoftMax "inf_as_zero" mode). The op table maps it; this is its unfused form.
torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::softmax_inf_as_zero(Tensor self, int dim) -> Tensor",
    [](torch::jit::Stack& stack) {
      int64_t dim = torch::jit::pop(stack).toInt();
      at::Tensor x = torch::jit::pop(stack).toTensor();
      at::Tensor all_inf = x.amax(dim, /*keepdim=*/true) == -std::numeric_limits<double>::infinity();
      torch::jit::push(stack, at::where(all_inf, at::zeros({}, x.options()), at::softmax(x, dim)));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

// PyTorch's SDPA turns a boolean mask into this bias too (True attends). One pass over the mask,
// bitwise (0 is all zero bits): no branch to mispredict, and vectorized. where(mask, zeros,
// full(-inf)) took 14.8 us for BERT's [1, 1, 128, 128] (in each of its 12 layers), this 3.2 (both
// called from Python, Zen 4).
template <typename Bits>
void fill_bias(const uint8_t* keep, Bits* bias, int64_t n, Bits minus_inf) {  // bytes: GCC vectorizes no bool loads
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) bias[i] = static_cast<Bits>(static_cast<Bits>(keep[i]) - 1) & minus_inf;
}

}  // namespace

at::Tensor attention_bias(const at::Tensor& mask, c10::ScalarType dtype) {
  if (mask.scalar_type() != at::kBool || !mask.device().is_cpu() || !at::isFloatingType(dtype))
    return at::where(mask, at::zeros({}, mask.options().dtype(dtype)),
                     at::full({}, -std::numeric_limits<double>::infinity(), mask.options().dtype(dtype)));
  at::Tensor keep = mask.contiguous();  // an expanded mask is materialized once
  at::Tensor bias = at::empty(mask.sizes(), mask.options().dtype(dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "llga::attention_bias", [&] {
    using Bits = std::conditional_t<sizeof(scalar_t) == 2, uint16_t, std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint64_t>>;
    static_assert(sizeof(Bits) == sizeof(scalar_t));
    fill_bias(reinterpret_cast<const uint8_t*>(keep.const_data_ptr<bool>()), reinterpret_cast<Bits*>(bias.mutable_data_ptr<scalar_t>()), keep.numel(),
              c10::bit_cast<Bits>(static_cast<scalar_t>(-std::numeric_limits<scalar_t>::infinity())));
  });
  return bias;
}

c10::IntArrayRef sdpa_scale_sizes() {  // [1] where quirks' sdpa_scale_4d is off
  static const std::vector<int64_t> sizes(quirks::enabled("sdpa_scale_4d") ? 4 : 1, 1);
  return sizes;
}

namespace {

torch::jit::RegisterOperators registered_bias({torch::jit::Operator(
    "llga::attention_bias(Tensor mask, Tensor like) -> Tensor",
    [](torch::jit::Stack& stack) {
      auto dtype = torch::jit::pop(stack).toTensor().scalar_type();  // the query's, at run time
      at::Tensor mask = torch::jit::pop(stack).toTensor();
      torch::jit::push(stack, attention_bias(mask, dtype));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

// sdpa_scale(q, scale): SDPA's scale (the given one, or 1 / sqrt(q.size(-1))), as a [1, 1, 1, 1]
// tensor of q's dtype. Computed at run time, not from the profiled head size and dtype: a group may
// run at other sizes, and its fallback, the spelled-out attention too, at other dtypes (a profiled
// fp32 scale made a bf16 call's scores fp32, and its last matmul fail).
torch::jit::RegisterOperators registered_scale({torch::jit::Operator(
    "llga::sdpa_scale(Tensor query, float? scale) -> Tensor",
    [](torch::jit::Stack& stack) {
      auto scale = torch::jit::pop(stack).toOptional<double>();
      at::Tensor q = torch::jit::pop(stack).toTensor();
      double value = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
      torch::jit::push(stack, at::full(sdpa_scale_sizes(), value, q.options()));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

}  // namespace llga
