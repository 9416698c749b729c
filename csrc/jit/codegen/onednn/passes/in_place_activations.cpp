// InPlaceActivations: a GELU or a clamp left to PyTorch whose input is a fusion group's fresh result
// that nothing else reads (for a clamp, also that result through an in-place GELU or a view) ->
// aten::gelu_ / aten::clamp_ on it. Computing in place is invisible there, and it skips an
// allocation of the output's size each call (fresh pages of a large allocation):
// - GELU (quirk gelu_post_op_slow, or any other reason): out of place, ViT-B/16's 12 GELUs of
//   [197, 3072] took 1.3 ms each inside the model against 0.4-0.55 alone; the whole model ran
//   0.98x the time in place (AMD EPYC Zen 3, 2 threads, in-process alternation, 20 rounds).
// - clamp: PT2E's reduce_range clamps the fp32 values before each quantize (torch_llga/_pt2e.py);
//   one left to PyTorch reads a GELU's output or an attention's heads merged (a view of a group's
//   result, transposed and reshaped), each read by the clamp alone.
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
bool group_result(const Value* v, unsigned families = kContraction | kEltwise | kBinary) {
  const Node* guarded = v->node();
  if (guarded->kind() != c10::prim::If || guarded->input(0)->node()->kind() != kGuard) return false;
  const Value* out = guarded->blocks()[0]->outputs()[v->offset()];
  const Node* group = out->node();
  if (group->kind() != kFusionGroup) return false;
  const Value* made = group->g(c10::attr::Subgraph)->outputs()[out->offset()];
  return made->uses().size() == 1 && in_family(made->node(), families);
}

// Whether writing v changes nothing anyone else sees: a group's fresh result, or what an in-place
// GELU or a view (or reshape) made of such a tensor, each link read by the next alone and in the
// same block (in a loop's body the op would apply again each iteration to the same tensor).
bool fresh(const Value* v) {
  const Node* n = v->node();
  if (v->uses().size() != 1) return false;
  // A matmul's or binary op's: autograd keeps no output of theirs (a sigmoid's it keeps, for an
  // unfused fallback run with gradients on).
  if (group_result(v, kContraction | kBinary)) return true;
  bool derived = n->kind() == c10::aten::gelu_ || (kind_flags(n->kind()) & kView);  // an earlier in-place GELU, a view op
  return derived && n->owningBlock() == n->input(0)->node()->owningBlock() && fresh(n->input(0));
}

bool floating(const Value* v) {
  auto t = v->type()->cast<torch::jit::TensorType>();
  return t && t->scalarType() && c10::isFloatingType(*t->scalarType());
}

void in_place_block(torch::jit::Block* b) {
  static const c10::Symbol gelu_ = c10::Symbol::fromQualString("aten::gelu_");
  static const c10::Symbol clamp_ = c10::Symbol::fromQualString("aten::clamp_");
  for (auto it = b->nodes().begin(); it != b->nodes().end();) {
    Node* n = *it++;
    for (auto* sub : n->blocks()) in_place_block(sub);
    bool gelu = n->kind() == c10::aten::gelu && n->inputs().size() == 2 && group_result(n->input(0));
    // A float tensor: clamp's Scalar bounds would make an integer one's result float.
    bool clamp = n->matches("aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor") &&
                 floating(n->input(0)) && fresh(n->input(0));
    if ((!gelu && !clamp) || n->input(0)->uses().size() != 1 || n->owningBlock() != n->input(0)->node()->owningBlock()) continue;
    std::string why = n->hasAttribute(kUnfusedReason) ? n->s(kUnfusedReason) : "";
    std::vector<Value*> inputs(n->inputs().begin(), n->inputs().end());
    Node* in_place = replace_with(n, gelu ? gelu_ : clamp_, inputs);
    if (!why.empty()) in_place->s_(kUnfusedReason, why + ", in place on the group's output");
  }
}

}  // namespace

void InPlaceActivations(std::shared_ptr<Graph>& g) {
  in_place_block(g->block());
  GRAPH_DUMP("After InPlaceActivations", g);
}

}  // namespace llga
