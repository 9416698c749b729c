// The graph fuser: asks oneDNN to partition each block and turns every supported partition that is
// worth it into one llga::FusionGroup node holding the partition's nodes as its subgraph.
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/utils/subgraph_utils.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "jit/codegen/onednn/mapping/graph_builder.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace SubgraphUtils = torch::jit::SubgraphUtils;
using torch::jit::AliasDb;

namespace {

// Whether n (or anything inside its blocks) reads one of the values.
bool reads_any(const Node* n, const std::unordered_set<const Value*>& values) {
  for (const Value* v : n->inputs())
    if (values.count(v)) return true;
  for (const auto* b : n->blocks())
    for (const Node* inner : b->nodes())
      if (reads_any(inner, values)) return true;
  for (const auto* b : n->blocks())
    for (const Value* v : b->outputs())
      if (values.count(v)) return true;
  return false;
}

// The partition's nodes may be interleaved with others. Moves every non-member that depends on a
// member to after the last member, so all members can become one node at the last member's place.
// False if that is impossible (a member depends on such a node through an edge oneDNN did not see,
// e.g. a shape read) or the alias analysis forbids a move.
bool gather(const std::vector<Node*>& members, AliasDb& db) {
  std::unordered_set<const Node*> in_partition(members.begin(), members.end());
  std::unordered_set<const Value*> member_outputs, moved_outputs;
  std::vector<Node*> to_move;
  Node* last = members.back();
  for (Node* n = members.front(); n != last; n = n->next()) {
    if (in_partition.count(n)) {
      if (reads_any(n, moved_outputs)) return false;
      member_outputs.insert(n->outputs().begin(), n->outputs().end());
    } else if (reads_any(n, member_outputs) || reads_any(n, moved_outputs)) {
      to_move.push_back(n);
      moved_outputs.insert(n->outputs().begin(), n->outputs().end());
    }
  }
  if (reads_any(last, moved_outputs)) return false;
  for (auto it = to_move.rbegin(); it != to_move.rend(); ++it)
    if (!db.moveAfterTopologicallyValid(*it, last)) return false;
  return true;
}

// The partition's ports as values of the block (ids are unique() numbers): its inputs, and for
// each output one use outside the partition (a null user if none), which after the merge reads
// the group output the port became. An input an earlier group now computes is found in `earlier`
// (port id -> that group's output). Nullopt if a port is no member's value.
std::optional<std::pair<std::vector<Value*>, std::vector<torch::jit::Use>>> port_values(
    const dnnl::graph::partition& p, const std::vector<Node*>& nodes, const std::unordered_map<size_t, Value*>& earlier) {
  std::unordered_map<size_t, Value*> by_id = earlier;
  for (Node* n : nodes) {
    for (Value* v : n->inputs()) by_id[v->unique()] = v;
    for (Value* v : n->outputs()) by_id[v->unique()] = v;
  }
  std::unordered_set<const Node*> members(nodes.begin(), nodes.end());
  std::vector<Value*> inputs;
  std::vector<torch::jit::Use> output_uses;
  for (const auto& lt : p.get_input_ports()) {
    if (!by_id.count(lt.get_id())) return {};  // the kernel then partitions the subgraph
    inputs.push_back(by_id.at(lt.get_id()));
  }
  for (const auto& lt : p.get_output_ports()) {
    if (!by_id.count(lt.get_id())) return {};
    const auto& uses = by_id.at(lt.get_id())->uses();
    auto outside = std::find_if(uses.begin(), uses.end(), [&](const torch::jit::Use& u) { return !members.count(u.user); });
    output_uses.push_back(outside != uses.end() ? *outside : torch::jit::Use(nullptr, 0));
  }
  return std::make_pair(inputs, output_uses);
}

std::string describe(const std::vector<Node*>& nodes) {
  std::string s;
  for (Node* n : nodes) {
    if (n->kind() == c10::prim::ListConstruct) continue;
    s += (s.empty() ? "" : ", ") + std::string(n->kind().toQualString());
  }
  return s;
}

// A group costs a guard, a branch and a oneDNN execution (several microseconds). Measured here:
// partitions of only cheap ops (elementwise, reshapes) lose to PyTorch's kernels below ~256K
// elements even with 3 ops, and a 2-op chain did not win at 1M. A compute op (conv, matmul,
// normalization, pooling, softmax) always pays.
bool worth_a_group(const std::vector<Node*>& nodes) {
  int64_t largest = 0;
  for (Node* n : nodes) {
    if (find_entry(n)->flags & kWorthAlone) return true;
    auto t = n->output()->type()->cast<torch::jit::TensorType>();
    if (t && t->numel()) largest = std::max<int64_t>(largest, *t->numel());
  }
  return nodes.size() >= kMinOpsForCheapGroup && largest >= kMinElementsForCheapGroup;
}

void mark_unfused(const std::vector<Node*>& nodes, const std::string& reason) {
  for (Node* n : nodes)
    if (n->kind() != c10::prim::ListConstruct) n->s_(kUnfusedReason, reason);
}

// Why each op of the block that oneDNN was never offered stays in PyTorch.
void mark_unmapped(torch::jit::Block* block, const BuiltGraph& built, AliasDb& db, BlockMappings& mappings) {
  std::unordered_set<const Node*> mapped;
  for (const auto& [id, n] : built.op_nodes) mapped.insert(n);
  for (Node* n : block->nodes()) {
    bool makes_tensor = std::any_of(n->outputs().begin(), n->outputs().end(), [](const Value* v) { return is_tensor(v); });
    if (mapped.count(n) || !n->kind().is_aten() || !makes_tensor || n->hasAttribute(kUnfusedReason)) continue;
    auto rejected = built.rejected.find(n);
    std::string reason = rejected != built.rejected.end() ? "oneDNN rejected it: " + rejected->second
                         : db.hasWriters(n)                ? "its tensors are written in place"
                                                           : mappings.reason(n);
    if (!reason.empty()) n->s_(kUnfusedReason, reason);
  }
}

// The binary ops oneDNN put in a partition where it computes them wrongly (a pooling or layer norm
// they read, a binary main op at unit spatial sizes: quirks::wrong_in_partition), or far slower
// than PyTorch (quirks::broadcast_up_post_op). The same op may rightly be a convolution's
// or matmul's post-op in another partitioning (ResNet's residual add reads a max-pool output): the
// fuser excludes these and asks oneDNN again.
std::vector<std::pair<Node*, const char*>> wrong_post_ops(const BuiltGraph& built) {
  std::vector<std::pair<Node*, const char*>> found;  // each with why it stays in PyTorch
  for (const auto& p : built.partitions) {
    if (!p.is_supported()) continue;
    auto nodes = built.nodes_of(p);
    std::unordered_set<const Node*> members(nodes.begin(), nodes.end());
    for (Node* n : nodes) {
      if (!is_binary_op(n)) continue;
      if (quirks::wrong_in_partition(n, members))
        found.emplace_back(n, "a post-op oneDNN computes wrongly in this partition (onednn_quirks.h, wrong_in_partition)");
      else if (quirks::broadcast_up_post_op(n, members))
        found.emplace_back(n, "a per-channel scale oneDNN runs slowly in this partition (onednn_quirks.h, broadcast_up_post_op)");
    }
  }
  return found;
}

// The ops a measured speed rule would have kept out (quirks::SpeedRuleTrial, on while FuseGraph
// runs): marked before they move into a group, for the speed_choices pass.
void mark_held_back() {
  auto* trial = quirks::SpeedRuleTrial::current();
  if (!trial) return;
  for (const auto& [n, rule] : trial->held_back) const_cast<Node*>(n)->s_(kSpeedRule, rule);
  trial->held_back.clear();
}

void fuse_block(torch::jit::Block* block, AliasDb& db) {
  for (Node* n : block->nodes())
    for (auto* b : n->blocks()) fuse_block(b, db);

  BlockMappings mappings;  // each node mapped once, for every round and the reasons
  BuildOptions opts;
  opts.mappings = &mappings;
  std::vector<Node*> excluded;
  std::vector<std::pair<Node*, const char*>> exclusions;  // with their reasons
  // A node whose tensors are written in place elsewhere keeps its place in program order.
  opts.may_map = [&](const Node* n) {
    return !db.hasWriters(n) && std::find(excluded.begin(), excluded.end(), n) == excluded.end();
  };
  BuiltGraph built = build_graph(block, opts);
  mark_held_back();
  for (auto bad = wrong_post_ops(built); !bad.empty(); bad = wrong_post_ops(built)) {
    for (const auto& [n, why] : bad) excluded.push_back(n);  // each round excludes more nodes: it ends
    exclusions.insert(exclusions.end(), bad.begin(), bad.end());
    built = build_graph(block, opts);
    mark_held_back();
  }
  mark_unmapped(block, built, db, mappings);
  for (const auto& [n, why] : exclusions) n->s_(kUnfusedReason, why);
  for (auto [n, spatial_only] : built.shape_specific) n->i_(kShapeSpecific, spatial_only ? kSpatialSizes : kAllSizes);  // InsertGuards
  if (!built.failure.empty())
    for (const auto& [id, n] : built.op_nodes) n->s_(kUnfusedReason, "oneDNN could not partition this block: " + built.failure);

  std::vector<std::pair<std::vector<Node*>, const dnnl::graph::partition*>> partitions;
  for (const auto& p : built.partitions) {
    std::vector<Node*> nodes = built.nodes_of(p);
    if (nodes.empty()) continue;
    if (!p.is_supported()) {
      GRAPH_DEBUG("oneDNN does not support the partition [", describe(nodes), "]: left to PyTorch");
      mark_unfused(nodes, "oneDNN has no partition for it here");
      continue;
    }
    if (!worth_a_group(nodes) && !runtime::fuse_all_partitions()) {
      GRAPH_DEBUG("Not worth a group: [", describe(nodes), "]");
      mark_unfused(nodes, "cheap ops too small to pay for a group (fewer than " + std::to_string(kMinOpsForCheapGroup) +
                              ", or under " + std::to_string(kMinElementsForCheapGroup / 1024) + "K elements)");
      continue;
    }
    partitions.emplace_back(std::move(nodes), &p);
  }

  std::unordered_map<size_t, Value*> earlier_outputs;  // port id -> the output of the group that computes it
  for (auto& [nodes, partition] : partitions) {
    for (size_t i = nodes.size(); i-- > 0;) {  // cat's list travels with it
      if (onednn_kind(nodes[i]) == op::kind::Concat) nodes.insert(nodes.begin() + i, nodes[i]->input(0)->node());
    }
    std::string ops = describe(nodes);
    if (!gather(nodes, db)) {
      GRAPH_DEBUG("Partition [", ops, "] cannot be made contiguous in the graph: left to PyTorch");
      mark_unfused(nodes, "its partition cannot be made contiguous in the graph");
      continue;
    }
    auto ports = port_values(*partition, nodes, earlier_outputs);
    Node* group = SubgraphUtils::createSingletonSubgraphAndUpdateAliasing(nodes.back(), kFusionGroup, db);
    for (auto it = nodes.rbegin() + 1; it != nodes.rend(); ++it)
      SubgraphUtils::mergeNodeIntoSubgraphAndUpdateAliasing(*it, group, db);
    if (ports) {
      const GroupPartition& gp = attach_partition(group, *partition, ports->first, ports->second);
      auto out_lts = partition->get_output_ports();
      for (size_t p = 0; p < out_lts.size(); ++p)
        if (gp.output[p] >= 0) earlier_outputs[out_lts[p].get_id()] = group->outputs()[gp.output[p]];
    }
    GRAPH_DEBUG("Fusion group of [", ops, "]");
  }
}

// A list that cat reads and something else reads too gets a private copy for cat, so the list
// construction can move into cat's group.
void give_cat_private_lists(torch::jit::Block* block) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) give_cat_private_lists(b);
    if (onednn_kind(n) != op::kind::Concat) continue;
    Node* list = n->input(0)->node();
    if (list->kind() != c10::prim::ListConstruct || list->output()->uses().size() == 1) continue;
    Node* copy = block->owningGraph()->createClone(list, [](Value* v) { return v; });
    copy->insertBefore(n);
    n->replaceInput(0, copy->output());
  }
}

}  // namespace

void FuseGraph(std::shared_ptr<Graph>& g) {
  give_cat_private_lists(g->block());
  {
    // The measured speed rules hold back unless the speed_choices pass is off or the choice is
    // pinned to the rules' side (its default); pinned to oneDNN's, they keep nothing out either.
    quirks::Fusing fusing;
    std::optional<quirks::SpeedRuleTrial> trial;
    if (speed_rules_measured()) trial.emplace();
    AliasDb db(g);
    fuse_block(g->block(), db);
  }
  torch::jit::EliminateDeadCode(g);
  GRAPH_DUMP("After FuseGraph", g);
}

void FuseBlock(torch::jit::Block* block) {
  quirks::Fusing fusing;  // no trial: the measured speed rules apply
  give_cat_private_lists(block);
  AliasDb db(block->owningGraph()->shared_from_this());
  fuse_block(block, db);
}

}  // namespace llga
