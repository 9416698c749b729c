#pragma once
// Turns one JIT block into a oneDNN Graph: every node the op table maps becomes its oneDNN op; every
// other node that touches tensors becomes a Wildcard (so oneDNN sees all the data dependencies);
// block outputs get End ops. The fuser builds one over a whole block, the kernel one over its
// fusion group's subgraph.
#include <torch/csrc/jit/ir/ir.h>

#include <oneapi/dnnl/dnnl_graph.hpp>

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
  // Give non-constant values their rank only, no sizes: the kernel's partition can then be compiled
  // for any input sizes (oneDNN infers the rest at compile time).
  bool ranks_only = false;
};

BuiltGraph build_graph(Block* block, const BuildOptions& opts);

// The logical tensor of a JIT value as profiled: its id is the value's unique() number.
dnnl::graph::logical_tensor value_lt(const Value* v, bool ranks_only = false);

bool is_constant(const Value* v);


}  // namespace llga
