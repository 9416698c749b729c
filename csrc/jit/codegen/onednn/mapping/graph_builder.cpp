#include "jit/codegen/onednn/mapping/graph_builder.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>

#include <algorithm>
#include <mutex>

#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

using dnnl::graph::logical_tensor;
using torch::jit::TensorType;

namespace {

// Wildcards also carry dtypes PyTorch-only ops use; mapped ops are limited to f32/bf16 by the table.
logical_tensor::data_type wildcard_dtype(const TensorType& t) {
  using dt = logical_tensor::data_type;
  if (!t.scalarType()) return dt::undef;
  if (auto d = to_dnnl_dtype(*t.scalarType())) return *d;
  switch (*t.scalarType()) {
    case c10::ScalarType::Half: return dt::f16;
    case c10::ScalarType::Int: return dt::s32;
    case c10::ScalarType::Char: return dt::s8;
    case c10::ScalarType::Byte: return dt::u8;
    case c10::ScalarType::Bool: return dt::boolean;
    default: return dt::undef;
  }
}

// Tensor values a node reads, including list elements and reads inside its sub-blocks.
void tensor_reads(Node* n, std::vector<Value*>& out) {
  for (Value* v : n->inputs()) {
    if (is_tensor(v)) {
      out.push_back(v);
    } else if (v->node()->kind() == c10::prim::ListConstruct || v->node()->kind() == c10::prim::TupleConstruct) {
      for (Value* e : v->node()->inputs())
        if (is_tensor(e)) out.push_back(e);
    }
  }
  for (Block* b : n->blocks()) {
    for (Node* inner : b->nodes()) tensor_reads(inner, out);
    for (Value* v : b->outputs())
      if (is_tensor(v)) out.push_back(v);
  }
}

std::vector<logical_tensor> lts(const std::vector<Value*>& values, bool ranks_only) {
  std::vector<logical_tensor> r;
  r.reserve(values.size());
  for (const Value* v : values) r.push_back(value_lt(v, ranks_only));
  return r;
}

std::vector<Value*> tensor_outputs(Node* n) {
  std::vector<Value*> r;
  for (Value* v : n->outputs())
    if (is_tensor(v)) r.push_back(v);
  return r;
}

}  // namespace

bool is_constant(const Value* v) { return v->node()->kind() == c10::prim::Constant; }

logical_tensor value_lt(const Value* v, bool ranks_only) {
  auto t = v->type()->cast<TensorType>();
  auto prop = is_constant(v) ? logical_tensor::property_type::constant : logical_tensor::property_type::variable;
  auto dtype = t ? wildcard_dtype(*t) : logical_tensor::data_type::undef;
  if (t && ranks_only && !is_constant(v) && t->dim())
    return logical_tensor(v->unique(), dtype, static_cast<int32_t>(*t->dim()), logical_tensor::layout_type::undef, prop);
  if (t) {
    auto sizes = t->sizes().concrete_sizes();
    auto strides = t->strides().concrete_sizes();
    if (sizes && strides && sizes->empty() && is_constant(v))  // a 0-dim constant broadcasts as [1]
      return logical_tensor(v->unique(), dtype, std::vector<int64_t>{1}, std::vector<int64_t>{1}, prop);
    if (sizes && strides) return logical_tensor(v->unique(), dtype, *sizes, *strides, prop);
    if (t->dim())
      return logical_tensor(v->unique(), dtype, static_cast<int32_t>(*t->dim()), logical_tensor::layout_type::undef, prop);
  }
  return logical_tensor(v->unique(), dtype, DNNL_GRAPH_UNKNOWN_NDIMS, logical_tensor::layout_type::undef, prop);
}

std::vector<Node*> BuiltGraph::nodes_of(const dnnl::graph::partition& p) const {
  std::vector<Node*> r;
  for (size_t id : p.get_ops()) {
    auto it = op_nodes.find(id);
    if (it != op_nodes.end()) r.push_back(it->second);
  }
  std::sort(r.begin(), r.end(), [](Node* a, Node* b) { return a->isBefore(b); });
  return r;
}

const dnnl::graph::partition* BuiltGraph::single_partition() const {
  const dnnl::graph::partition* found = nullptr;
  for (const auto& p : partitions) {
    if (!p.is_supported()) continue;
    if (found) return nullptr;
    found = &p;
  }
  return found && found->get_ops_num() == op_nodes.size() ? found : nullptr;
}

BuiltGraph build_graph(Block* block, const BuildOptions& opts) {
  BuiltGraph built;
  dnnl::graph::graph g(dnnl::engine::kind::cpu);
  size_t next_id = 0;

  auto add_wildcard = [&](Node* n) {
    std::vector<Value*> reads;
    tensor_reads(n, reads);
    auto outs = tensor_outputs(n);
    if (reads.empty() && outs.empty()) return;
    g.add_op(op(next_id++, op::kind::Wildcard, lts(reads, opts.ranks_only), lts(outs, opts.ranks_only), n->kind().toQualString()));
  };

  for (Node* n : block->nodes()) {
    if (n->kind() == c10::prim::Constant) continue;
    std::optional<OpSpec> mapped;  // without a cache of the block's mappings
    const OpSpec* spec = nullptr;
    if (opts.may_map(n)) {
      if (opts.mappings) {
        spec = opts.mappings->spec(n);
      } else if ((mapped = map_node(n))) {
        spec = &*mapped;
      }
    }
    if (!spec) {
      add_wildcard(n);
      continue;
    }
    op o(next_id, spec->kind, lts(spec->inputs, opts.ranks_only), lts(tensor_outputs(n), opts.ranks_only), n->kind().toUnqualString());
    for (auto& [name, value] : spec->attrs) std::visit([&](const auto& v) { o.set_attr(name, v); }, value);
    try {
      g.add_op(o);  // oneDNN validates the op here: a rejected op stays in PyTorch
      built.op_nodes[next_id++] = n;
      if (spec->shape_specific) built.shape_specific.emplace_back(n, spec->spatial_only);
    } catch (const dnnl::error& e) {
      GRAPH_DEBUG("oneDNN rejected ", n->kind().toQualString(), " (", e.what(), "): left to PyTorch");
      built.rejected[n] = e.what();
      add_wildcard(n);
    }
  }
  for (Value* v : block->outputs()) {
    if (!is_tensor(v)) continue;
    try {
      g.add_op(op(next_id++, op::kind::End, lts({v}, opts.ranks_only), {}, "end"));
    } catch (const dnnl::error& e) {
      if (!quirks::enabled("end_of_boolean_output")) throw;
      // oneDNN v3.2's End takes no boolean tensor (a mask the graph returns). Only PyTorch ops
      // (wildcards) produce those, and no partition holds a wildcard: the End is not needed.
      GRAPH_DEBUG("No End op for graph output %", v->debugName(), " (", e.what(), ")");
    }
  }

  // oneDNN 3.12's pattern matcher can throw std::out_of_range from get_partitions (a linear of a
  // [1, 1, 1] input beside others: found by fuzzing; PyTorch's built-in fuser crashes on DeepAndWide
  // with the same message): the block is then left to PyTorch.
  try {
    g.finalize();
    runtime::stats().partitionings.fetch_add(1, std::memory_order_relaxed);
    built.partitions = g.get_partitions(dnnl::graph::partition::policy::fusion);
  } catch (const std::exception& e) {
    if (!quirks::enabled("partitioning_throws")) throw;
    GRAPH_DEBUG("oneDNN could not partition the block (", e.what(), "): left to PyTorch");
    built.partitions.clear();
    built.failure = e.what();
  }
  return built;
}

namespace {

const c10::Symbol kPartition = c10::Symbol::attr("partition");

// The partition on its group node: copied with the node (a copy of the graph binds the same
// partition, its frozen weights being the same tensors) and freed with the last graph holding it,
// taken by a kernel or not. The node holds it as the owner of an empty tensor's memory, in a
// tensor-list attribute: the one attribute kind that can own an object and that graphs still
// print ("[<Tensors>]"; an IValue capsule cannot be printed).
struct PartitionOwner {
  c10::intrusive_ptr<GroupPartition> partition;
  static void release(void* self) { delete static_cast<PartitionOwner*>(self); }
};

at::Tensor carrying(c10::intrusive_ptr<GroupPartition> p) {
  static char nothing;  // an empty tensor's data: never read
  auto* owner = new PartitionOwner{std::move(p)};
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       c10::DataPtr(&nothing, owner, &PartitionOwner::release, c10::Device(c10::kCPU)), nullptr,
                       /*resizable=*/false);
  return at::empty({0}, at::kByte).set_(storage, 0, {0}, {1});
}

c10::intrusive_ptr<GroupPartition> carried(const at::Tensor& t) {
  auto* owner = t.storage().data_ptr().cast_context<PartitionOwner>(&PartitionOwner::release);
  return owner ? owner->partition : nullptr;
}

int64_t index_of(c10::ArrayRef<Value*> values, const Value* v) {
  auto it = std::find(values.begin(), values.end(), v);
  return it == values.end() ? -1 : it - values.begin();
}

}  // namespace

const GroupPartition& attach_partition(Node* group, const dnnl::graph::partition& p, const std::vector<Value*>& inputs,
                      const std::vector<torch::jit::Use>& output_uses) {
  auto gp = c10::make_intrusive<GroupPartition>();
  gp->partition = p;
  for (Value* v : inputs) {
    bool weight = is_constant(v);
    gp->input.push_back(weight ? -1 : index_of(group->inputs(), v));
    gp->constant.push_back(weight ? torch::jit::toIValue(v)->toTensor() : at::Tensor());
  }
  for (const auto& use : output_uses)
    gp->output.push_back(use.user ? index_of(group->outputs(), use.user->input(use.offset)) : -1);
  group->ts_(kPartition, {carrying(gp)});
  return *gp;
}

c10::intrusive_ptr<GroupPartition> subgraph_partition(torch::jit::Graph& subgraph, bool ranks_only) {
  BuildOptions opts;
  opts.ranks_only = ranks_only;
  BuiltGraph built = build_graph(subgraph.block(), opts);
  const dnnl::graph::partition* p = built.single_partition();
  if (!p) return nullptr;
  auto gp = c10::make_intrusive<GroupPartition>();
  gp->partition = *p;
  std::unordered_map<size_t, const Value*> constants;
  for (const Node* n : subgraph.nodes())
    if (n->kind() == c10::prim::Constant) constants[n->output()->unique()] = n->output();
  auto by_id = [](c10::ArrayRef<Value*> values, size_t id) -> int64_t {
    auto it = std::find_if(values.begin(), values.end(), [&](const Value* v) { return v->unique() == id; });
    return it == values.end() ? -1 : it - values.begin();
  };
  for (const auto& lt : p->get_input_ports()) {
    auto c = constants.find(lt.get_id());
    gp->input.push_back(c != constants.end() ? -1 : by_id(subgraph.inputs(), lt.get_id()));
    gp->constant.push_back(c != constants.end() ? torch::jit::toIValue(c->second)->toTensor() : at::Tensor());
  }
  for (const auto& lt : p->get_output_ports()) gp->output.push_back(by_id(subgraph.outputs(), lt.get_id()));
  return gp;
}

c10::intrusive_ptr<GroupPartition> group_partition(const Node* group) {
  if (group->hasAttribute(kPartition) && group->kindOf(kPartition) == torch::jit::AttributeKind::ts &&
      group->ts(kPartition).size() == 1)
    if (auto gp = carried(group->ts(kPartition)[0])) return gp;
  // A group made elsewhere: partition anew.
  return subgraph_partition(*group->g(c10::attr::Subgraph), /*ranks_only=*/false);
}

bool same_ports(const GroupPartition& a, const GroupPartition& b) {
  if (a.input != b.input || a.output != b.output) return false;
  for (size_t p = 0; p < a.constant.size(); ++p)
    if (a.constant[p].unsafeGetTensorImpl() != b.constant[p].unsafeGetTensorImpl()) return false;
  return true;
}

}  // namespace llga
