// QuantizedPoolOwnKernel: quantize(adaptive_avg_pool2d(dequantize(x), [1, 1])) of a profiled 4-D
// int8 x -> llga::quantized_global_avg_pool (kernels/quantized_pool.h). Before the fuser, which
// would give the three ops a oneDNN partition of their own.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include "jit/codegen/onednn/kernels/quantized_pool.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// The int8 value q's pool reads (through its dequantize), if q is such a pattern's quantize.
Value* pooled_codes(const Node* q) {
  if (!q->matches("aten::quantize_per_tensor(Tensor self, float scale, int zero_point, ScalarType dtype) -> Tensor") ||
      !torch::jit::toIValue(q->input(1)) || !torch::jit::toIValue(q->input(2)) || !torch::jit::toIValue(q->input(3)))
    return nullptr;
  const Node* pool = q->input(0)->node();
  if (pool->kind() != c10::aten::adaptive_avg_pool2d || pool->output()->uses().size() != 1) return nullptr;
  auto size = torch::jit::toIValue(pool->input(1));
  if (!size || !size->isIntList() || size->toIntVector() != std::vector<int64_t>{1, 1}) return nullptr;
  const Node* dq = pool->input(0)->node();
  if (dq->kind() != c10::aten::dequantize || dq->inputs().size() != 1 || dq->output()->uses().size() != 1) return nullptr;
  auto x = dq->input(0)->type()->cast<TensorType>();
  if (!x || x->dim() != 4 || (x->scalarType() != at::kQUInt8 && x->scalarType() != at::kQInt8)) return nullptr;
  return dq->input(0);
}

void replace_pools(torch::jit::Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* q = *it++;
    for (torch::jit::Block* b : q->blocks()) replace_pools(b);
    if (Value* codes = pooled_codes(q)) replace_with(q, kQuantizedGlobalAvgPool, {codes, q->input(1), q->input(2), q->input(3)});
  }
}

}  // namespace

void QuantizedPoolOwnKernel(std::shared_ptr<Graph>& g) {
  if (!runtime::own_kernels_enabled() || !own_quantized_pool_runs()) return;
  replace_pools(g->block());
  torch::jit::EliminateDeadCode(g);
  GRAPH_DUMP("After QuantizedPoolOwnKernel", g);
}

}  // namespace llga
