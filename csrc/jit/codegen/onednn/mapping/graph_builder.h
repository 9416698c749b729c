#pragma once
// Turns one JIT block into a oneDNN Graph: every node the op table maps becomes its oneDNN op; every
// other node that touches tensors becomes a Wildcard (so oneDNN sees all the data dependencies);
// block outputs get End ops. The fuser builds one over a whole block, the kernel one over its
// fusion group's subgraph.
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/jit/ir/ir.h>

#include <oneapi/dnnl/dnnl_graph.hpp>

#include "jit/codegen/onednn/mapping/op_table.h"

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace llga {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

struct BuiltGraph {
  std::vector<dnnl::graph::partition> partitions;
  std::unordered_map<size_t, Node*> op_nodes;  // oneDNN op id -> the JIT node it came from
  std::unordered_map<Node*, std::string> rejected;  // mapped nodes oneDNN refused, with its message
  // Mapped nodes whose mapping holds for the profiled sizes only, and whether for their spatial ones only.
  std::vector<std::pair<Node*, bool>> shape_specific;
  std::string failure;  // oneDNN's message when it could not partition the graph at all (no partitions)
  std::vector<Node*> nodes_of(const dnnl::graph::partition& p) const;
  // The one supported partition holding every mapped op, if that is what the graph formed
  // (End and Wildcard ops come back as unsupported partitions of their own).
  const dnnl::graph::partition* single_partition() const;
};

// Values made by prim::Constant (frozen weights) are constant logical tensors, so oneDNN may cache
// their reorders; they are inputs of the oneDNN graph, not ops.
struct BuildOptions {
  // Nodes that may be mapped at all (the fuser excludes nodes whose tensors are mutated).
  std::function<bool(const Node*)> may_map = [](const Node*) { return true; };
  // The block's mappings, kept across builds of one block (the fuser's exclusion rounds); null:
  // each node is mapped afresh.
  BlockMappings* mappings = nullptr;
  // Give non-constant values their rank only, no sizes: the kernel's partition can then be compiled
  // for any input sizes (oneDNN infers the rest at compile time).
  bool ranks_only = false;
};

BuiltGraph build_graph(Block* block, const BuildOptions& opts);

// The logical tensor of a JIT value as profiled: its id is the value's unique() number.
dnnl::graph::logical_tensor value_lt(const Value* v, bool ranks_only = false);

bool is_constant(const Value* v);

// The partition a fusion group was made of, with its ports by position, carried by the group node
// itself (attribute "partition": copied with the node, freed with its graph, graph_builder.cpp):
// the kernel compiles it without asking oneDNN to partition the subgraph again, so warm-up
// partitions each block once, not each group too. Port ids are those of the graph that was partitioned; what
// they mean here is by position.
struct GroupPartition : c10::intrusive_ptr_target {
  dnnl::graph::partition partition;
  std::vector<int64_t> input;  // per input port: the group input it reads, or -1: `constant`
  std::vector<at::Tensor> constant;  // per input port: the frozen weight it reads (input -1)
  std::vector<int64_t> output;  // per output port: the group output it is, or -1 (none)
};

// Records p on a group just made of its nodes and returns the record. inputs: the values its input
// ports read (looked up before the merge); output_uses: per output port, a use outside the group
// (a null user: none), which now reads the group output the port became.
const GroupPartition& attach_partition(Node* group, const dnnl::graph::partition& p, const std::vector<Value*>& inputs,
                                     const std::vector<torch::jit::Use>& output_uses);
// The group's recorded partition (a copy of the graph's group shares it), or else the one its
// subgraph forms (null if it forms none).
c10::intrusive_ptr<GroupPartition> group_partition(const Node* group);
// The one partition a group's subgraph forms (null if not one), its port ids the subgraph's value
// ids. With ranks_only, it compiles for any input sizes of those ranks.
c10::intrusive_ptr<GroupPartition> subgraph_partition(torch::jit::Graph& subgraph, bool ranks_only);
// Whether two partitions of one group have the same ports in the same order.
bool same_ports(const GroupPartition& a, const GroupPartition& b);


}  // namespace llga
