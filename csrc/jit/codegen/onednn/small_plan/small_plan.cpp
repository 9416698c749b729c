// The small-graph plan's entry points (small_plan.h) and its operator, llga::SmallPlan (the pass
// that forms it is plan_small_graph.cpp, the guard in front of it guard_shapes.cpp). The program
// is program.h, its compiler compiler.h (and the compile_*.cpp handlers), its loops run.cpp.
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "jit/codegen/onednn/settings/settings.h"
#include "jit/codegen/onednn/small_plan/compiler.h"
#include "jit/codegen/onednn/small_plan/program.h"
#include "jit/codegen/onednn/small_plan/small_plan.h"

namespace llga {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Stack;

bool small_plan_has_step(const Node* n) { return Compiler::find_handler(n).has_value(); }

namespace {

std::shared_ptr<const SmallProgram> compile(const Graph& subgraph, std::string* why) {
  auto p = std::make_shared<SmallProgram>();
  Compiler c(subgraph, *p);
  if (!c.compile()) {
    if (why) *why = c.why();
    return nullptr;
  }
  runtime::stats().plan_compilations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

// The programs PlanSmallGraph compiled, by the id it gave the node, until the node's operator
// takes its program. The interpreter runs a copy of the graph (attributes copied, subgraphs
// copied too), so the id, not the subgraph, finds it. An entry lives while the graph the pass
// planned does; one whose graph is gone (a plan no operator was made for) goes at the next plan.
struct KeptPrograms {
  std::mutex mutex;
  int64_t next_id = 1;
  std::unordered_map<int64_t, std::pair<std::weak_ptr<Graph>, std::shared_ptr<const SmallProgram>>> by_id;
};
KeptPrograms& kept_programs() {
  static KeptPrograms kept;
  return kept;
}
const c10::Symbol kPlanId = c10::Symbol::attr("plan_id");

std::shared_ptr<const SmallProgram> program_of(const Node* plan) {
  if (plan->hasAttribute(kPlanId)) {
    KeptPrograms& kept = kept_programs();
    std::lock_guard<std::mutex> lock(kept.mutex);
    auto it = kept.by_id.find(plan->i(kPlanId));
    if (it != kept.by_id.end()) return it->second.second;
  }
  std::string why;
  auto program = compile(*plan->g(c10::attr::Subgraph), &why);
  TORCH_CHECK(program, "torch_llga: a small-graph plan no longer compiles (", why, ")");
  return program;
}

}  // namespace

bool compile_small_plan(Node* plan, std::string* why) {
  std::shared_ptr<Graph> subgraph = plan->g(c10::attr::Subgraph);
  auto program = compile(*subgraph, why);
  if (!program) return false;
  KeptPrograms& kept = kept_programs();
  std::lock_guard<std::mutex> lock(kept.mutex);
  for (auto it = kept.by_id.begin(); it != kept.by_id.end();)
    it = it->second.first.expired() ? kept.by_id.erase(it) : std::next(it);
  int64_t id = kept.next_id++;
  kept.by_id[id] = {subgraph, program};
  plan->i_(kPlanId, id);
  return true;
}

namespace {

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        kSmallPlan,
        [](const Node* node) -> torch::jit::Operation {
          auto program = program_of(node);
          return [program](Stack& stack) { run_plan(*program, stack); };
        },
        c10::AliasAnalysisKind::PURE_FUNCTION),
});

}  // namespace

}  // namespace llga
