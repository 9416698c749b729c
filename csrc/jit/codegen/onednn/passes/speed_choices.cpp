// SpeedChoices: a group that holds an op a measured speed rule would have kept out of it (the quirk
// registry's `measured` rows: a GELU after an fp32 matmul on AVX2 kernels, a group norm) runs in
// one of two forms, the faster on this machine, for the sizes it is called at:
//
//   %fused = llga::SpeedChoice[choice_id=7, speed_rules="gelu_post_op_slow"](the group's tensor inputs)
//   %y = prim::If(%fused)
//     block0: %y0 = llga::FusionGroup_7(...)            llga::SpeedChoiceEnd[choice_id=7]()  -> (%y0)
//     block1: the group's ops, fused with the rule applied (the GELU in PyTorch), and the end  -> (%y1)
//
// Each rule was measured on one CPU (a GELU post-op cost 2-3x PyTorch's GELU in AVX2 kernels; a
// group norm ran a reference kernel): on another, or at other sizes, the fused form may win, so
// the rule is a default that a measurement overrides (runtime/speed_choice.cpp, choice site
// "speed_rule"). Pinned to a side, no second form is made (FuseGraph applies the rules, or not).
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/utils/subgraph_utils.h>

#include <atomic>
#include <string>
#include <vector>

#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::Block;

std::optional<size_t> pin() { return choices::pinned(choices::site("speed_rule")); }

// The rules that held ops back in this group, ", "-separated ("" if none).
std::string rules_in(const Node* group) {
  std::string rules;
  for (const Node* n : group->g(c10::attr::Subgraph)->nodes()) {
    if (!n->hasAttribute(kSpeedRule)) continue;
    const std::string& rule = n->s(kSpeedRule);
    if (rules.find(rule) == std::string::npos) rules += (rules.empty() ? "" : ", ") + rule;
  }
  return rules;
}

void collect(Block* block, std::vector<Node*>& groups, std::vector<Node*>& marked) {
  for (Node* n : block->nodes()) {
    for (Block* b : n->blocks()) collect(b, groups, marked);
    if (n->kind() == kFusionGroup && !rules_in(n).empty()) groups.push_back(n);
    if (n->hasAttribute(kSpeedRule)) marked.push_back(n);  // held back, yet in no group: PyTorch's anyway
  }
}

void strip_marks(Block* block) {
  for (Node* n : block->nodes()) {
    for (Block* b : n->blocks()) strip_marks(b);
    if (n->hasAttribute(kSpeedRule)) n->removeAttribute(kSpeedRule);
    if (n->kind() == kFusionGroup) strip_marks(n->g(c10::attr::Subgraph)->block());
  }
}

void add_end(Block* block, int64_t id) {
  Node* end = block->owningGraph()->create(kSpeedChoiceEnd, 0);
  end->i_(kChoiceId, id);
  end->insertBefore(block->return_node());
}

// The group in both forms under a SpeedChoice; returns the rule form's block, to fuse.
Block* two_forms(Node* group, const std::string& rules) {
  Graph& graph = *group->owningGraph();
  // Process-unique, apart from group ids (the choice's records are forgotten with it).
  static std::atomic<int64_t> next_choice_id{int64_t{1} << 40};
  const int64_t id = next_choice_id++;
  std::vector<Value*> tensors;
  for (Value* v : group->inputs())
    if (v->type()->cast<torch::jit::TensorType>()) tensors.push_back(v);
  Node* choice = graph.create(kSpeedChoice, tensors, 1);
  choice->output()->setType(c10::BoolType::get());
  choice->i_(kChoiceId, id)->s_(kSpeedRules, rules);
  choice->insertBefore(group);
  Node* branch = graph.create(c10::prim::If, {choice->output()}, group->outputs().size());
  branch->insertAfter(choice);
  Block* fused = branch->addBlock();
  Block* ruled = branch->addBlock();
  for (size_t i = 0; i < group->outputs().size(); ++i) {
    branch->output(i)->setType(group->output(i)->type());
    group->output(i)->replaceAllUsesWith(branch->output(i));
  }
  // The rule's form first: the group's ops again, from its subgraph, as the fuser found them.
  {
    torch::jit::WithInsertPoint at(ruled->return_node());
    auto outs = torch::jit::insertGraph(graph, *group->g(c10::attr::Subgraph), group->inputs());
    for (Value* v : outs) ruled->registerOutput(v);
  }
  add_end(ruled, id);
  group->moveBefore(fused->return_node());
  for (Value* v : group->outputs()) fused->registerOutput(v);
  add_end(fused, id);
  return ruled;
}

}  // namespace

bool speed_rules_measured() { return !runtime::switched_off("speed_choices") && pin() != 0u; }

void SpeedChoices(std::shared_ptr<Graph>& g) {
  std::vector<Node*> groups, marked;
  collect(g->block(), groups, marked);
  if (!speed_rules_measured() || pin() == 1u) {  // one form: the rules applied, or (pinned to oneDNN) not
    strip_marks(g->block());
    return;
  }
  for (Node* group : groups) {
    std::string rules = rules_in(group);
    Block* ruled = two_forms(group, rules);
    GRAPH_DEBUG("A group in two forms, timed: fused, and with ", rules, " applied");
    FuseBlock(ruled);  // the rules apply here (no trial on)
    strip_marks(ruled);
  }
  // The marks on the rule form's ops (left to PyTorch) and on ops that reached no group are spent;
  // those inside the fused form's groups say which op a rule would have held back (explain()).
  for (Node* n : marked) n->removeAttribute(kSpeedRule);
  GRAPH_DUMP("After SpeedChoices", g);
}

}  // namespace llga
