#pragma once
// What the own-kernel passes (own_quantize.cpp, own_layer_norm.cpp) share: the nodes they take
// become nodes of an llga:: op over the same inputs.
#include <torch/csrc/jit/ir/ir.h>

namespace llga {

// Each node of `block` (and of the blocks inside it) that `takes` accepts -> a node of `kind` over
// its first `num_inputs` inputs, which its output's uses move to. The node itself is left for
// dead code elimination.
template <typename Takes>
void replace_with_own_kernel(torch::jit::Block* block, const Takes& takes, c10::Symbol kind, size_t num_inputs) {
  for (torch::jit::Node* n : block->nodes()) {
    for (torch::jit::Block* b : n->blocks()) replace_with_own_kernel(b, takes, kind, num_inputs);
    if (!takes(n)) continue;
    torch::jit::Node* own = block->owningGraph()->create(kind, n->inputs().slice(0, num_inputs), 1)->insertBefore(n);
    own->output()->copyMetadata(n->output());
    n->output()->replaceAllUsesWith(own->output());
  }
}

}  // namespace llga
