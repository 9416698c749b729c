// Each fusion group was built for the profiled sizes, dtypes and devices of its inputs (static
// shapes in StaticReshape, pooling output sizes, ...). In front of each group goes an llga::Guard
// that checks them at run time (strides need no fallback: the kernel compiles per stride pattern;
// nor do other sizes of the same rank, under the "compile" shape policy, for groups whose ops hold
// for any sizes):
//
//   %x.checked, %ok = llga::Guard[types=[Float(1, 3, 224, 224, strides=...)]](%x)
//   %y = prim::If(%ok)
//     block0(): %y.1 = llga::FusionGroup(%x.checked, %weight)      -> fused
//     block1(): %y.2 = prim::FallbackGraph(%x.checked, %weight)    -> the unfused ops, which the
//                                                                    executor profiles on its own
// The guard also sends inputs holding NaN or Inf to the fallback when the group has an op that may
// turn them into numbers (oneDNN's ReLU, Clamp and max-pool do; eager propagates them). On a
// mismatch it turns any LLGA (opaque) tensor into a strided one for the fallback. Not scanned: an
// attention bias (llga::attention_bias: 0 or -inf by construction), and rows gathered from a
// constant table with no NaN/Inf (an embedding's output, or views of it): such values are finite
// whatever the inputs (XML-CNN scanned its 1.2 MB embedding output every call).
// A value several such guards check, which nothing writes, is scanned once (XML-CNN's embedding
// feeds three conv + relu groups: three scans of 1.2 MB were 0.15 ms a call):
//
//   %finite = llga::AllFinite(%x)
//   %x.1, %ok.1 = llga::Guard[finite_given=[0]](%x, %finite)
//   ...
//   %x.2, %ok.2 = llga::Guard[finite_given=[0]](%x, %finite)
#include <ATen/ops/all.h>
#include <ATen/ops/isfinite.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <atomic>
#include <unordered_set>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/small_plan/small_plan.h"

namespace llga {

using torch::jit::Block;

namespace {

// Whether NaN/Inf inputs must be kept from the group: some op in it may turn them into numbers.
bool needs_finite_inputs(const Node* group) {
  for (const Node* n : group->g(c10::attr::Subgraph)->nodes()) {
    if (n->kind() == c10::prim::Constant || n->kind() == c10::prim::ListConstruct) continue;
    const OpEntry* entry = find_entry(n);
    if (!entry || !(entry->flags & kKeepsNaN)) return true;
  }
  return false;
}

// Whether no NaN/Inf can be in v whatever the model's inputs, or those it holds are meant: the
// guard need not scan it. Views of an embedding of a constant, all-finite table (the table is
// checked once, here), or an attention bias. v must have no writers (the caller's AliasDb says so).
bool unscanned(const Value* v, std::unordered_map<const Value*, bool>& tables) {
  const Node* n = v->node();  // through views (the op table's kView)
  while ((kind_flags(n->kind()) & kView) && n->inputs().size() > 0 && is_tensor(n->input(0))) n = n->input(0)->node();
  if (n->kind() == kAttentionBias) return true;
  if (n->kind() != c10::aten::embedding || n->input(0)->node()->kind() != c10::prim::Constant) return false;
  const Value* table = n->input(0);
  // The table's own values, not its bits read as another dtype (a view(dtype) on the way).
  auto vt = v->type()->cast<torch::jit::TensorType>();
  auto tt = table->type()->cast<torch::jit::TensorType>();
  if (!vt || !tt || !vt->scalarType() || vt->scalarType() != tt->scalarType()) return false;
  auto found = tables.find(table);
  if (found == tables.end()) {
    auto t = torch::jit::toIValue(table);
    bool finite = t && t->isTensor() && t->toTensor().is_floating_point();
    if (finite) {  // in slices: isfinite of a whole word-vector table would be its size again in bools
      const at::Tensor rows = t->toTensor().reshape({-1});
      constexpr int64_t kSlice = 1 << 20;
      for (int64_t i = 0; finite && i < rows.numel(); i += kSlice)
        finite = at::isfinite(rows.slice(0, i, std::min(rows.numel(), i + kSlice))).all().item<bool>();
    }
    found = tables.emplace(table, finite).first;
  }
  return found->second;
}

// The outputs of groups whose guards scanned their inputs, or whose inputs are such outputs (or
// finite by construction): as LLGA tensors, guards skip them. Any other LLGA input is scanned too
// (kScanLlgaToo): a group that carries NaN/Inf through (only convs, matmuls, arithmetic, data
// movement: no scan) made it from an input nobody scanned, or one in another block did. A conv ->
// max-pool pair on a model's input is two groups: the pool's guard scans the conv's output
// (oneDNN's max-pool turns NaN into numbers).
using ScannedOutputs = std::unordered_set<const Value*>;

Node* insert_guard(Node* group, const std::unordered_set<const Value*>& unwritten,
                   std::unordered_map<const Value*, bool>& tables, ScannedOutputs& scanned) {
  static std::atomic<int64_t> next_group_id{0};
  group->i_(kGroupId, next_group_id++);
  Graph* g = group->owningGraph();
  std::vector<Value*> checked;
  std::vector<c10::TypePtr> types;
  for (Value* v : group->inputs()) {
    if (!is_tensor(v) || v->node()->kind() == c10::prim::Constant) continue;  // constants cannot change
    checked.push_back(v);
    types.push_back(v->type());
  }

  Node* guard = g->create(kGuard, checked, checked.size() + 1)->insertBefore(group);
  guard->tys_(c10::attr::types, types);
  bool plan = group->kind() == kSmallPlan;  // exact sizes, dense memory; its loops keep NaN as eager does
  // A group's partition holds for any sizes of the profiled ranks: an op mapped for its profiled
  // sizes (a reshape's target, a pooling's windows) is mapped again at new ones, the partition
  // made for them (FusionKernel::maps_at). A small plan is compiled for the profiled sizes.
  guard->i_(kShapeFree, plan ? 0 : kAnySizes);
  guard->i_(kFiniteInputs, !plan && needs_finite_inputs(group));
  if (plan) guard->i_(kPlainInputs, 1);
  std::vector<int64_t> given;
  bool inputs_clean = true;  // no NaN/Inf reaches any input: none leaves the group either
  for (Value* v : checked) {
    auto dtype = v->type()->expect<torch::jit::TensorType>()->scalarType();
    bool codes = dtype && !c10::isFloatingType(*dtype);  // int8 activations: no NaN to carry
    bool finite = codes || (unwritten.count(v) && unscanned(v, tables));
    given.push_back(finite ? kNotScanned : scanned.count(v) ? -1 : kScanLlgaToo);
    inputs_clean &= finite || scanned.count(v);
  }
  if (!guard->i(kFiniteInputs)) given.clear();
  if (std::any_of(given.begin(), given.end(), [](int64_t g) { return g != -1; })) guard->is_(kFiniteGiven, given);
  std::unordered_map<Value*, Value*> checked_value;
  for (size_t i = 0; i < checked.size(); ++i) {
    guard->output(i)->setType(checked[i]->type());
    checked_value[checked[i]] = guard->output(i);
  }
  Value* ok = guard->output(checked.size())->setType(c10::BoolType::get());

  std::vector<Value*> inputs;
  std::vector<int64_t> guarded;
  for (Value* v : group->inputs()) {
    inputs.push_back(checked_value.count(v) ? checked_value.at(v) : v);
    guarded.push_back(checked_value.count(v));
  }
  group->is_(kGuardedInputs, guarded);

  Node* branch = g->create(c10::prim::If, {ok}, group->outputs().size())->insertAfter(guard);
  for (size_t i = 0; i < group->outputs().size(); ++i) {
    branch->output(i)->setType(group->output(i)->type());
    group->output(i)->replaceAllUsesWith(branch->output(i));
    if (guard->i(kFiniteInputs) || inputs_clean) scanned.insert(branch->output(i));
  }
  Block* fused = branch->addBlock();
  Block* fallback = branch->addBlock();

  {
    torch::jit::WithInsertPoint point(fallback->return_node());
    auto outs = torch::jit::insertGraph(*g, *group->g(c10::attr::Subgraph), inputs);
    for (Value* v : outs) fallback->registerOutput(v);
    for (Node* n : fallback->nodes())  // fused again from scratch when the fallback is optimized
      if (n->hasAttribute(kSpeedRule)) n->removeAttribute(kSpeedRule);
    torch::jit::removeTensorTypeSpecializations(fallback);
    torch::jit::replaceBlockWithFallbackGraph(fallback, inputs);
  }

  group->moveBefore(fused->return_node());
  for (size_t i = 0; i < group->inputs().size(); ++i) group->replaceInput(i, inputs[i]);
  for (Value* v : group->outputs()) fused->registerOutput(v);
  return guard;
}

// One llga::AllFinite per value that two or more scanning guards in one block check, placed before
// the first of them, when nothing in the graph writes to the value (or an alias of it): its
// contents are then those the first guard would scan.
void share_finite_scans(const std::vector<Node*>& guards, const std::unordered_set<const Value*>& unwritten) {
  std::unordered_map<Value*, std::vector<Node*>> scanners;
  std::unordered_map<Value*, bool> llga_too;  // an LLGA tensor of it is scanned too (kScanLlgaToo)
  for (Node* guard : guards) {
    if (!guard->i(kFiniteInputs)) continue;
    size_t checked = guard->outputs().size() - 1;
    auto given = guard->hasAttribute(kFiniteGiven) ? guard->is(kFiniteGiven) : std::vector<int64_t>(checked, -1);
    for (size_t i = 0; i < checked; ++i)
      if (unwritten.count(guard->input(i)) && (given[i] == -1 || given[i] == kScanLlgaToo)) {
        scanners[guard->input(i)].push_back(guard);
        llga_too[guard->input(i)] |= given[i] == kScanLlgaToo;
      }
  }
  for (auto& [v, checked_by] : scanners) {
    if (checked_by.size() < 2) continue;
    Block* block = checked_by.front()->owningBlock();
    if (std::any_of(checked_by.begin(), checked_by.end(), [&](Node* n) { return n->owningBlock() != block; })) continue;
    Node* first = *std::min_element(checked_by.begin(), checked_by.end(), [](Node* a, Node* b) { return a->isBefore(b); });
    Graph* g = first->owningGraph();
    Node* scan = g->create(kAllFinite, {v})->insertBefore(first);
    {
      torch::jit::WithInsertPoint point(scan);
      scan->addInput(g->insertConstant(llga_too[v]));
    }
    Value* finite = scan->output()->setType(c10::BoolType::get());
    for (Node* guard : checked_by) {
      size_t checked = guard->outputs().size() - 1;
      auto given = guard->hasAttribute(kFiniteGiven) ? guard->is(kFiniteGiven) : std::vector<int64_t>(checked, -1);
      int64_t extra = guard->inputs().size() - checked;
      for (size_t i = 0; i < checked; ++i)
        if (guard->input(i) == v) given[i] = extra;
      guard->addInput(finite);
      guard->is_(kFiniteGiven, given);
    }
  }
}

void collect_groups(Block* block, std::vector<Node*>& groups) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) collect_groups(b, groups);
    if (n->kind() == kFusionGroup || n->kind() == kSmallPlan) groups.push_back(n);
  }
}

}  // namespace

void InsertGuards(std::shared_ptr<Graph>& g) {
  std::vector<Node*> groups;
  collect_groups(g->block(), groups);
  std::unordered_set<const Value*> unwritten;  // group inputs nothing writes (before guards exist)
  {
    torch::jit::AliasDb alias_db(g);
    for (Node* group : groups)
      for (Value* v : group->inputs())
        if (is_tensor(v) && !alias_db.hasWriters(v)) unwritten.insert(v);
  }
  std::vector<Node*> guards;
  std::unordered_map<const Value*, bool> tables;  // embedding tables checked for NaN/Inf
  ScannedOutputs scanned;  // groups in program order: a value's producer comes first
  for (Node* group : groups) guards.push_back(insert_guard(group, unwritten, tables, scanned));
  share_finite_scans(guards, unwritten);
  GRAPH_DUMP("After InsertGuards", g);
}

}  // namespace llga
