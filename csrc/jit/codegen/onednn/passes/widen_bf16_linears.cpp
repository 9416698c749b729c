// WidenBf16Linears: on a CPU where oneDNN has no bf16 kernels (AVX2 without AVX-VNNI-2), a bf16
// linear over a constant weight -> llga::widened_linear (kernels/widened_linear.h): fp32 GEMMs
// over the weight widened a block at a time, ~10x eager's bf16 matmul there. oneDNN forms no bf16
// partition on such a CPU, so these linears would stay PyTorch's. After RowLinears: linears of a
// few rows are the row kernel's (it reads bf16 weights as they are).
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <ATen/ATen.h>

#include <vector>

#include "jit/codegen/onednn/kernels/widened_linear.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::TensorType;

bool bf16_constant(Value* v, bool none_too) {
  auto c = torch::jit::toIValue(v);
  if (!c) return false;
  if (c->isNone()) return none_too;
  return c->isTensor() && c->toTensor().scalar_type() == at::kBFloat16 && c->toTensor().device().is_cpu();
}

void find_bf16_linears(torch::jit::Block* block, std::vector<Node*>& found) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) find_bf16_linears(b, found);
    if (n->kind() != c10::aten::linear || n->inputs().size() != 3) continue;
    auto x = n->input(0)->type()->cast<TensorType>();
    if (x && x->scalarType() == at::kBFloat16 && bf16_constant(n->input(1), false) && bf16_constant(n->input(2), true))
      found.push_back(n);
  }
}

}  // namespace

void WidenBf16Linears(std::shared_ptr<Graph>& g) {
  if (runtime::own_kernels_enabled() && widened_linear_runs()) {
    std::vector<Node*> found;
    find_bf16_linears(g->block(), found);
    for (Node* n : found) replace_with(n, kWidenedLinear, {n->input(0), n->input(1), n->input(2)});
  }
  GRAPH_DUMP("After WidenBf16Linears", g);
}

}  // namespace llga
