// QuantizedPoolOwnKernel: pools of a profiled 4-D int8 x between its dequantize and a quantize
// (kernels/quantized_pool.h), before the fuser, which would give the three ops a oneDNN partition
// of their own:
// - quantize(adaptive_avg_pool2d(dequantize(x), [1, 1])) -> llga::quantized_global_avg_pool;
// - quantize(max_pool2d(dequantize(x), ...)) on x's own grid -> llga::quantized_max_pool2d.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include "jit/codegen/onednn/kernels/quantized_pool.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// The pool q quantizes, if it reads the dequantize of a 4-D int8 value, alone (the pool and the
// dequantize read by nothing else), and q's parameters are constants.
Node* quantized_pool(const Node* q) {
  if (q->kind() != c10::aten::quantize_per_tensor || q->inputs().size() != 4 || !quantize_params(q) ||
      !torch::jit::toIValue(q->input(3)))
    return nullptr;
  Node* pool = q->input(0)->node();
  if ((pool->kind() != c10::aten::adaptive_avg_pool2d && pool->kind() != c10::aten::max_pool2d) ||
      q->input(0)->uses().size() != 1)
    return nullptr;
  const Node* dq = pool->input(0)->node();
  if (dq->kind() != c10::aten::dequantize || dq->inputs().size() != 1 || dq->output()->uses().size() != 1) return nullptr;
  auto x = dq->input(0)->type()->cast<TensorType>();
  if (!x || x->dim() != 4 || (x->scalarType() != at::kQUInt8 && x->scalarType() != at::kQInt8)) return nullptr;
  return pool;
}

bool global_average(const Node* pool) {
  if (!pool->matches("aten::adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor")) return false;
  auto size = torch::jit::toIValue(pool->input(1));
  return size && size->isIntList() && size->toIntVector() == std::vector<int64_t>{1, 1};
}

// A max pool whose quantize keeps its input's grid (scale, zero point and dtype of the codes).
bool max_on_its_grid(const Node* pool, const Node* q) {
  if (!pool->matches("aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, "
                     "int[2] dilation=1, bool ceil_mode=False) -> Tensor"))
    return false;
  const Value* codes = pool->input(0)->node()->input(0);
  auto from = quantize_params(codes->node()), to = quantize_params(q);
  return from && to && from->scale == to->scale && from->zero_point == to->zero_point &&
         codes->type()->expect<TensorType>()->scalarType() == q->output()->type()->expect<TensorType>()->scalarType();
}

void replace_pools(torch::jit::Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* q = *it++;
    for (torch::jit::Block* b : q->blocks()) replace_pools(b);
    Node* pool = quantized_pool(q);
    const bool average = pool && global_average(pool);
    if (!pool || (!average && !max_on_its_grid(pool, q))) continue;
    if (runtime::switched_off(average ? "quantized_global_avg_pool" : "quantized_max_pool2d")) continue;
    Value* codes = pool->input(0)->node()->input(0);
    // The parameters as numbers (FX's reference flow passes them as tensors).
    auto params = *quantize_params(q);
    torch::jit::WithInsertPoint at(q);
    Graph* g = block->owningGraph();
    Value* scale = g->insertConstant(params.scale);
    Value* zero_point = g->insertConstant(params.zero_point);
    auto in = pool->inputs();
    if (average)
      replace_with(q, kQuantizedGlobalAvgPool, {codes, scale, zero_point, q->input(3)});
    else
      replace_with(q, kQuantizedMaxPool2d, {codes, in[1], in[2], in[3], in[4], in[5], scale, zero_point, q->input(3)});
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
