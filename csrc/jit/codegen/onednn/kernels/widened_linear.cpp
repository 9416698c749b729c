// llga::widened_linear: a bf16 linear as fp32 GEMMs over blocks of the weight widened to fp32.
//
// Where oneDNN has no bf16 kernels, PyTorch's bf16 matmul is its plain cpublas loop: a prefill's
// linears (128 rows x SmolLM2-135M's [1536, 576]) took 27 ms against 2.5-3.7 for the same product
// in fp32 (2 threads, AMD EPYC Zen 3, AVX2). Widening the whole weight would hold a second, fp32
// copy of it (twice the bf16 model, the memory a bf16 user chose bf16 to save); a block of output
// rows at a time (~1 MB as fp32, L2/L3-resident while the GEMM reads it) costs a read of the bf16
// block and a write of its floats. Sums are fp32 and rounded to bf16 once, as eager's are.
#include "jit/codegen/onednn/kernels/widened_linear.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <algorithm>
#include <vector>

#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/torch_onednn.h"

namespace llga {

namespace {

// The widened block's size: ~1 MB of floats, at least 64 output rows (fewer starve the GEMM).
constexpr int64_t kBlockBytes = 1 << 20;
constexpr int64_t kMinBlockRows = 64;

bool fits(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  auto bf16_cpu = [](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 && t.device().is_cpu() && !t.requires_grad() && t.layout() == at::kStrided;
  };
  return widened_linear_runs() && bf16_cpu(x) && bf16_cpu(weight) && x.dim() >= 1 && weight.dim() == 2 &&
         x.size(-1) == weight.size(1) && x.numel() > 0 && weight.numel() > 0 &&
         (!bias || (bf16_cpu(*bias) && bias->dim() == 1 && bias->size(0) == weight.size(0)));
}

}  // namespace

bool widened_linear_runs() { return onednn::load_error().empty() && !onednn::cpu().bf16; }

namespace {

at::Tensor widened(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const at::Tensor rows = x.reshape({-1, k}).to(at::kFloat);
  const at::Tensor bias_f32 = bias ? bias->to(at::kFloat) : at::Tensor();
  at::Tensor out = at::empty({rows.size(0), n}, x.options());
  const int64_t block = std::min(n, std::max(kMinBlockRows, kBlockBytes / (k * 4)));
  at::Tensor widened = at::empty({block, k}, rows.options());
  at::Tensor sums = at::empty({rows.size(0), block}, rows.options());
  for (int64_t c = 0; c < n; c += block) {
    const int64_t b = std::min(block, n - c);
    at::Tensor w = widened.narrow(0, 0, b);
    w.copy_(weight.narrow(0, c, b));
    at::Tensor y = b == block ? sums : at::empty({rows.size(0), b}, rows.options());
    if (bias)
      at::addmm_out(y, bias_f32.narrow(0, c, b), rows, w.t());
    else
      at::mm_out(y, rows, w.t());
    out.narrow(1, c, b).copy_(y);  // rounded to bf16
  }
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = n;
  return out.view(sizes);
}

}  // namespace

at::Tensor widened_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!fits(x, weight, bias)) return at::linear(x, weight, bias);
  static choices::Chooser<at::Tensor> chooser("widened_linear");
  const choices::Key key{choices::bucket(x.numel() / x.size(-1)), weight.size(0), weight.size(1), bias.has_value()};
  auto describe = [&] {
    return std::pair{std::string("llga::widened_linear"), c10::str(x.numel() / x.size(-1), " rows x ", weight.sizes(), " bf16")};
  };
  return chooser.run(key, describe, [&](size_t i) { return i == 0 ? widened(x, weight, bias) : at::linear(x, weight, bias); });
}

namespace {

torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::widened_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    [](torch::jit::Stack& stack) {
      RECORD_FUNCTION("llga::widened_linear", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
      auto bias = torch::jit::pop(stack).toOptional<at::Tensor>();
      at::Tensor weight = torch::jit::pop(stack).toTensor();
      at::Tensor x = torch::jit::pop(stack).toTensor();
      torch::jit::push(stack, widened_linear(x, weight, bias));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

}  // namespace llga
