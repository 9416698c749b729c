// aten::size(relu(x)) reads the relu's output only for its shape, yet that read makes the value
// escape any partition. Shape-preserving ops have their input's sizes, so the read moves to the
// input, as far up as such ops go, and the op may fuse with its neighbours.
#include <torch/csrc/jit/jit_log.h>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"

namespace llga {

namespace {

bool shape_preserving(const torch::jit::Node* n) {
  const OpEntry* e = find_entry(n);
  return e && (e->flags & kShapePreserving) && n->inputs().size() >= 1 && is_tensor(n->input(0));
}

void defer(torch::jit::Block* block) {
  for (torch::jit::Node* n : block->nodes()) {
    for (auto* b : n->blocks()) defer(b);
    if (n->kind() != c10::aten::size) continue;
    torch::jit::Value* x = n->input(0);
    while (shape_preserving(x->node())) x = x->node()->input(0);
    if (x != n->input(0)) n->replaceInput(0, x);
  }
}

}  // namespace

void DeferSizeCheck(std::shared_ptr<Graph>& g) {
  defer(g->block());
  GRAPH_DUMP("After DeferSizeCheck", g);
}

}  // namespace llga
