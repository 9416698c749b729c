// QuantizeOwnKernel: a quantize the fuser left to PyTorch, of a profiled fp32 tensor of 16K values
// or more -> llga::quantize_per_tensor (kernels/quantize.h), PyTorch's codes at both threads' speed.
// After the fuser: the quantizes inside groups are oneDNN's.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include "jit/codegen/onednn/kernels/quantize.h"
#include "jit/codegen/onednn/passes/own_kernel_nodes.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

bool takes(const Node* n) {
  if (!n->matches("aten::quantize_per_tensor(Tensor self, float scale, int zero_point, ScalarType dtype) -> Tensor"))
    return false;
  auto x = n->input(0)->type()->cast<torch::jit::TensorType>();
  return x && x->scalarType() == at::kFloat && x->numel() && *x->numel() >= kOwnQuantizeMinElements;
}

}  // namespace

void QuantizeOwnKernel(std::shared_ptr<Graph>& g) {
  if (!runtime::own_kernels_enabled() || !own_quantize_runs()) return;
  replace_with_own_kernel(g->block(), takes, kQuantizePerTensor, 4);
  torch::jit::EliminateDeadCode(g);
  GRAPH_DUMP("After QuantizeOwnKernel", g);
}

}  // namespace llga
