// LayerNormOwnKernel: a layer norm over the last dim of a profiled fp32 tensor whose output a
// quantize reads -> llga::layer_norm (kernels/layer_norm.h). Before the fuser, which would give
// it a partition of its own: oneDNN's layer norm with the quantize fused takes its reference
// kernel (quirk layer_norm_quantized_output), so the quantize stays apart either way.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include "jit/codegen/onednn/kernels/layer_norm.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/passes/own_kernel_nodes.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// A constant fp32 tensor of n values, or None.
bool constant_parameter(const Value* v, int64_t n) {
  auto p = torch::jit::toIValue(v);
  if (!p) return false;
  if (p->isNone()) return true;
  return p->isTensor() && p->toTensor().scalar_type() == at::kFloat && p->toTensor().numel() == n;
}

bool takes(const Node* n) {
  if (!n->matches("aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
                  "float eps=1e-05, bool cudnn_enable=True) -> Tensor"))
    return false;
  auto x = n->input(0)->type()->cast<TensorType>();
  if (!x || x->scalarType() != at::kFloat || !x->sizes().concrete_sizes() || x->sizes().concrete_sizes()->empty())
    return false;
  const int64_t last = x->sizes().concrete_sizes()->back();
  auto shape = torch::jit::toIValue(n->input(1));
  if (!shape || !shape->isIntList() || shape->toIntVector() != std::vector<int64_t>{last}) return false;
  if (!constant_parameter(n->input(2), last) || !constant_parameter(n->input(3), last) || !torch::jit::toIValue(n->input(4)))
    return false;
  for (const torch::jit::Use& use : n->output()->uses())
    if (use.user->kind() == c10::aten::quantize_per_tensor && quirks::layer_norm_quantized_output(use.user))
      return true;
  return false;
}

}  // namespace

void LayerNormOwnKernel(std::shared_ptr<Graph>& g) {
  if (!runtime::own_kernels_enabled() || !own_layer_norm_runs()) return;
  replace_with_own_kernel(g->block(), takes, kLayerNorm, 5);
  torch::jit::EliminateDeadCode(g);
  GRAPH_DUMP("After LayerNormOwnKernel", g);
}

}  // namespace llga
