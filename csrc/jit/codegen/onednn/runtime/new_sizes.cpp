// A group at input sizes the fuser never saw (shape policy "compile"): the partition for any sizes
// of the profiled ranks, or, where an op was mapped for its profiled sizes (a reshape's target, a
// pooling's windows), a partition mapped again at the new ones; and whether each of the group's
// ops still maps to oneDNN at them (the op table judges some ops by their sizes). GRAPH_DEBUG
// (PYTORCH_JIT_LOG_LEVEL=">>new_sizes") says which op keeps the group unfused at them.
#include "jit/codegen/onednn/runtime/fusion_kernel.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <algorithm>
#include <unordered_set>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/llga_nodes.h"
#include "jit/codegen/onednn/runtime/to_dense.h"

namespace llga {

using torch::jit::Stack;

namespace {

// Dims 2.. of v's sizes in `now` (new sizes) and `then` (profiled) agree.
bool same_spatial_sizes(const Value* now, const Value* then) {
  auto a = now->type()->cast<torch::jit::TensorType>(), b = then->type()->cast<torch::jit::TensorType>();
  auto sa = a ? a->sizes().concrete_sizes() : std::nullopt, sb = b ? b->sizes().concrete_sizes() : std::nullopt;
  return sa && sb && sa->size() == sb->size() && sa->size() >= 2 && std::equal(sa->begin() + 2, sa->end(), sb->begin() + 2);
}

// v's sizes in `now` and `then` agree.
bool same_sizes(const Value* now, const Value* then) {
  auto a = now->type()->cast<torch::jit::TensorType>(), b = then->type()->cast<torch::jit::TensorType>();
  auto sa = a ? a->sizes().concrete_sizes() : std::nullopt, sb = b ? b->sizes().concrete_sizes() : std::nullopt;
  return sa && sb && *sa == *sb;
}

}  // namespace

// The fuser partitioned the block for the profiled sizes; a partition for any sizes of the same
// ranks is asked of oneDNN only once some call brings other sizes (once: threads compiling other
// sizes at the same time wait for it).
const FusionKernel::Partition* FusionKernel::any_sizes() {
  std::call_once(any_sizes_once_, [&] { any_sizes_ = partition_of(*subgraph_, /*ranks_only=*/true); });
  return any_sizes_.get();
}

// The partition the graph (the group's subgraph, typed with some sizes) forms, or null if it is
// not one with the group's ports.
std::unique_ptr<FusionKernel::Partition> FusionKernel::partition_of(torch::jit::Graph& graph, bool ranks_only) {
  auto gp = subgraph_partition(graph, ranks_only);
  if (!gp || !same_ports(*gp, *ports_)) return nullptr;
  auto p = std::make_unique<Partition>();
  p->partition = gp->partition;
  for (const auto& lt : gp->partition.get_input_ports()) p->in_ids.push_back(lt.get_id());
  for (const auto& lt : gp->partition.get_output_ports()) p->out_ids.push_back(lt.get_id());
  return p;
}

// How the group runs at the sizes of these arguments. The op table keeps some ops from oneDNN at
// some sizes only (onednn_quirks.h: a broadcast oneDNN computes wrongly), and the partition for any
// sizes of the profiled ranks would otherwise run them at sizes the fuser never saw. The group's
// ops run once, unfused, to learn the sizes of every value; the op table then judges each op at
// them. An op mapped for its profiled sizes that has others now makes the group's partition for
// these sizes only: `sized` is the subgraph with them. Once per new input sizes.
FusionKernel::AtSizes FusionKernel::maps_at(c10::ArrayRef<c10::IValue> args, std::shared_ptr<torch::jit::Graph>* sized) {
  auto g = subgraph_->copy();
  std::vector<Value*> made;
  for (Node* n : g->nodes())
    for (Value* v : n->outputs())
      if (v->type()->cast<torch::jit::TensorType>()) made.push_back(v);
  const size_t first = g->outputs().size();
  for (Value* v : made) g->registerOutput(v);
  Stack stack;
  for (const c10::IValue& a : args) stack.push_back(a.isTensor() ? c10::IValue(llga_to_dense(a.toTensor())) : a);
  for (size_t i = 0; i < args.size(); ++i)
    if (stack[i].isTensor()) g->inputs()[i]->setType(torch::jit::TensorType::create(stack[i].toTensor()));
  try {
    torch::jit::Code code(g, "llga_sizes");
    torch::jit::InterpreterState(code).run(stack);
  } catch (const std::exception& e) {  // the caller's fallback run raises it where eager would
    GRAPH_DEBUG("The group's ops failed on these inputs (", e.what(), ")");
    return AtSizes::kUnfused;
  }
  for (size_t k = 0; k < made.size(); ++k)
    if (stack[first + k].isTensor()) made[k]->setType(torch::jit::TensorType::create(stack[first + k].toTensor()));
  while (g->outputs().size() > first) g->eraseOutput(g->outputs().size() - 1);
  std::unordered_set<const Node*> members;
  for (const Node* n : g->nodes()) members.insert(n);
  // An op mapped for its profiled spatial sizes (kSpatialSizes: a pooling's windows) holds at another
  // batch size only (the partition for any sizes keeps its windows); one mapped for all its profiled
  // sizes (a reshape's target) holds at those only. Where one's sizes changed, the group's
  // partition is made for these sizes. Not where the group reads a number (a size an op of another
  // group computed): the compiled partitions are keyed by the tensors' sizes alone.
  bool these_sizes = false;
  auto profiled = subgraph_->nodes().begin();
  for (const Node* n : g->nodes()) {
    const Node* p = *profiled++;
    if (!n->hasAttribute(kShapeSpecific)) continue;
    bool holds = n->i(kShapeSpecific) == kSpatialSizes
                     ? same_spatial_sizes(n->input(0), p->input(0)) && same_spatial_sizes(n->output(0), p->output(0))
                     : same_sizes(n->input(0), p->input(0)) && same_sizes(n->output(0), p->output(0));
    these_sizes |= !holds;
  }
  if (these_sizes && !std::all_of(args.begin(), args.end(), [](const c10::IValue& a) { return a.isTensor(); })) {
    GRAPH_DEBUG("At these input sizes an op mapped for its profiled sizes has others, and the group reads a number: "
                "the group runs unfused for them");
    return AtSizes::kUnfused;
  }
  const quirks::ValuesOnly values_only;  // a speed rule does not send a fused group unfused
  for (const Node* n : g->nodes()) {
    if (is_binary_op(n) && quirks::wrong_in_partition(n, members)) {
      GRAPH_DEBUG("At these input sizes oneDNN computes ", n->kind().toQualString(), " wrongly as a post-op: the group runs unfused for them");
      return AtSizes::kUnfused;
    }
    if (!find_entry(n) || map_node(n)) continue;
    GRAPH_DEBUG("At these input sizes ", n->kind().toQualString(), " stays out of oneDNN (", unmapped_reason(n),
                "): the group runs unfused for them");
    return AtSizes::kUnfused;
  }
  if (!these_sizes) return AtSizes::kAnySizes;
  *sized = std::move(g);
  return AtSizes::kTheseSizes;
}

}  // namespace llga
