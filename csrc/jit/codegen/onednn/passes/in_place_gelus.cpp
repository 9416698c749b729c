// InPlaceGelus: a GELU left to PyTorch (quirk gelu_post_op_slow, or any other reason) that alone
// reads a fusion group's result -> aten::gelu_ on it. The result is a fresh tensor nothing else
// reads (fused or in the group's fallback), so computing in place is invisible, and it skips an
// allocation of the output's size each call: out of place, ViT-B/16's 12 GELUs of [197, 3072] took
// 1.3 ms each inside the model against 0.4-0.55 alone (fresh pages of a large allocation; AMD EPYC
// Zen 3, 2 threads); the whole model ran 0.98x the time in place (in-process alternation, 20 rounds).
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <string>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"

namespace llga {

namespace {

// Whether v is a fresh tensor a group computes and nothing else in it reads: the output of a guard's
// If (its group or the group's fallback) made by a matmul, an elementwise or a binary op (those give
// a new tensor unfused too, where a view-like op's fallback could hand back its input), read by the
// group's return alone (no other output of the group a view of it in the fallback).
bool group_result(const Value* v) {
  const Node* guarded = v->node();
  if (guarded->kind() != c10::prim::If || guarded->input(0)->node()->kind() != kGuard) return false;
  const Value* out = guarded->blocks()[0]->outputs()[v->offset()];
  const Node* group = out->node();
  if (group->kind() != kFusionGroup) return false;
  const Value* made = group->g(c10::attr::Subgraph)->outputs()[out->offset()];
  return made->uses().size() == 1 && in_family(made->node(), kContraction | kEltwise | kBinary);
}

void in_place_block(torch::jit::Block* b) {
  for (auto it = b->nodes().begin(); it != b->nodes().end();) {
    Node* n = *it++;
    for (auto* sub : n->blocks()) in_place_block(sub);
    // One use: nothing else reads the output (a graph output has the return's use too); in the
    // block that made it (in a loop's body it would be read again each iteration).
    if (n->kind() != c10::aten::gelu || n->inputs().size() != 2 || n->input(0)->uses().size() != 1 ||
        n->owningBlock() != n->input(0)->node()->owningBlock() || !group_result(n->input(0)))
      continue;
    std::string why = n->hasAttribute(kUnfusedReason) ? n->s(kUnfusedReason) : "";
    Node* in_place = replace_with(n, c10::Symbol::fromQualString("aten::gelu_"), {n->input(0), n->input(1)});
    if (!why.empty()) in_place->s_(kUnfusedReason, why + ", in place on the group's output");
  }
}

}  // namespace

void InPlaceGelus(std::shared_ptr<Graph>& g) {
  in_place_block(g->block());
  GRAPH_DUMP("After InPlaceGelus", g);
}

}  // namespace llga
