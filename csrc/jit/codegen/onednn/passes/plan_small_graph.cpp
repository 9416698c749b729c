// PlanSmallGraph: a graph whose tensors are all tiny (DeepAndWide, ranking heads) becomes one
// llga::SmallPlan node (small_plan.h), which InsertGuards puts behind a guard for the profiled
// sizes and dtypes of its inputs, with the unfused graph as its fallback:
//
//   %ad.1, %user.1, %wide.1, %ok = llga::Guard[types=[...], plain_inputs=1](%ad, %user, %wide)
//   %y = prim::If(%ok)
//     block0(): %y.1 = llga::SmallPlan_0(%ad.1, %user.1, %wide.1)
//     block1(): %y.2 = prim::FallbackGraph_1(%ad.1, %user.1, %wide.1)
//
// It takes the whole graph or nothing: one plan is one guard and one node for the interpreter;
// part of a graph would still pay the interpreter and ATen for the rest. Larger graphs go to the
// fuser, whose oneDNN kernels beat the plan's plain loops there.
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/utils/subgraph_utils.h>

#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"
#include "jit/codegen/onednn/small_plan/small_plan.h"

namespace llga {

namespace {

// Cheap checks before any change to the graph: an op the plan has a step for (or a list that
// cat reads), and every tensor it computes within the plan's element limit.
bool may_plan(const Node* n) {
  if (n->kind() != c10::prim::ListConstruct && !small_plan_has_step(n)) return false;
  for (const Value* v : n->outputs()) {
    auto t = v->type()->cast<torch::jit::TensorType>();
    if (!t) continue;
    auto numel = t->numel();
    if (!numel || *numel > kSmallPlanMaxElements) return false;
  }
  return true;
}

}  // namespace

void PlanSmallGraph(std::shared_ptr<Graph>& g) {
  if (!runtime::small_plans_enabled()) return;
  if (runtime::fuse_all_partitions()) return;  // the knob that tests each oneDNN mapping alone
  // Every node but constants, and a tuple of the results, which stays outside: the plan returns the tensors.
  std::vector<Node*> nodes;
  Node* results = g->outputs().size() == 1 ? g->outputs()[0]->node() : nullptr;
  bool tuple = results && results->kind() == c10::prim::TupleConstruct;
  for (Node* n : g->block()->nodes()) {
    if (n->kind() == c10::prim::Constant || (tuple && n == results)) continue;
    if (!may_plan(n)) return;
    nodes.push_back(n);
  }
  if (nodes.empty()) return;

  Node* plan = torch::jit::SubgraphUtils::createSingletonSubgraph(nodes.back(), kSmallPlan);
  for (auto it = nodes.rbegin() + 1; it != nodes.rend(); ++it) torch::jit::SubgraphUtils::mergeNodeIntoSubgraph(*it, plan);
  std::string why;
  if (!compile_small_plan(plan, &why)) {
    GRAPH_DEBUG("No small-graph plan: ", why);
    torch::jit::SubgraphUtils::unmergeSubgraph(plan);
    return;
  }
  GRAPH_DUMP("After PlanSmallGraph", g);
}

}  // namespace llga
