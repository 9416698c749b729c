// An output read only by other fusion groups may stay in the layout oneDNN picks (often blocked):
// the next group reads it as is and no reorder to strided happens at the boundary. An output that
// PyTorch reads (another op, a graph output) is a normal strided tensor.
#include <torch/csrc/jit/jit_log.h>

#include "jit/codegen/onednn/passes.h"

namespace llga {

namespace {

void propagate(torch::jit::Block* block) {
  for (torch::jit::Node* n : block->nodes()) {
    for (auto* b : n->blocks()) propagate(b);
    if (n->kind() != kFusionGroup) continue;
    std::vector<int64_t> opaque;
    for (torch::jit::Value* out : n->outputs()) {
      bool only_groups = !out->uses().empty();
      for (const auto& use : out->uses()) only_groups = only_groups && use.user->kind() == kFusionGroup;
      opaque.push_back(only_groups ? 1 : 0);
    }
    n->is_(kOpaqueOutputs, opaque);
  }
}

}  // namespace

void PropagateLayout(std::shared_ptr<Graph>& g) {
  propagate(g->block());
  GRAPH_DUMP("After PropagateLayout", g);
}

}  // namespace llga
