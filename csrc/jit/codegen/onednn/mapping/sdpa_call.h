#pragma once
// A call of aten::scaled_dot_product_attention as torch_llga's rewrites take it (DecomposeOps
// spells it out or hands it to an own kernel, DecodeAttention hands a decoder step's to its
// kernel): the one reader of its arguments and of the conditions every rewrite shares.
#include <torch/csrc/jit/ir/ir.h>

#include <optional>
#include <vector>

namespace llga {

struct SdpaCall {
  torch::jit::Value* mask;  // nullptr: none
  std::vector<int64_t> q_sizes, k_sizes, v_sizes;
  c10::ScalarType dtype;    // q's
};

// The call n is, where it is one for inference: dropout 0, not causal, no grouped-query heads
// (enable_gqa false), the scale None or a constant, rank-4 q, k and v of profiled sizes, q's dtype
// known; else nullopt.
std::optional<SdpaCall> sdpa_call(const torch::jit::Node* n);

}  // namespace llga
