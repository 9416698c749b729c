// sdpa_call (sdpa_call.h).
#include "jit/codegen/onednn/mapping/sdpa_call.h"

#include <torch/csrc/jit/ir/constants.h>

namespace llga {

namespace {

std::optional<std::vector<int64_t>> rank4_sizes(const torch::jit::Value* v) {
  auto t = v->type()->cast<c10::TensorType>();
  auto sizes = t ? t->sizes().concrete_sizes() : std::nullopt;
  if (!sizes || sizes->size() != 4) return std::nullopt;
  return sizes;
}

}  // namespace

std::optional<SdpaCall> sdpa_call(const torch::jit::Node* n) {
  static const char* kSchema =
      "aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
      "float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor";
  if (!n->matches(kSchema)) return std::nullopt;
  auto dropout = torch::jit::constant_as<double>(n->input(4));
  auto causal = torch::jit::constant_as<bool>(n->input(5));
  auto gqa = torch::jit::constant_as<bool>(n->input(7));
  auto scale = torch::jit::toIValue(n->input(6));
  if (!dropout || *dropout != 0 || !causal || *causal || !gqa || *gqa || !scale || !(scale->isNone() || scale->isDouble()))
    return std::nullopt;
  auto qs = rank4_sizes(n->input(0)), ks = rank4_sizes(n->input(1)), vs = rank4_sizes(n->input(2));
  auto dtype = n->input(0)->type()->expect<c10::TensorType>()->scalarType();
  if (!qs || !ks || !vs || !dtype) return std::nullopt;
  torch::jit::Value* mask = n->input(3)->type()->kind() == c10::TypeKind::NoneType ? nullptr : n->input(3);
  return SdpaCall{mask, *qs, *ks, *vs, *dtype};
}

}  // namespace llga
