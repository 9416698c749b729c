// MergeParallelLinears: linears of one input with constant weights -> one linear over the weights
// stacked, each former output a slice of its last dim (a view: no copy). Two kinds:
// - fp32/bf16, bias-free (a decoder's q, k and v projections; its MLP's gate and up). oneDNN forms
//   no partition of independent matmuls, so three projections were three groups, each reading x
//   and a weight of a few hundred columns, where its one-row kernels use the cores poorly; one
//   matmul of all the columns is one group. Measured on generate() of a SmolLM2-135M-shaped Llama
//   (fp32, prompt 128, 64 new tokens, 2 threads, AMD EPYC Zen 4, AVX2; three pairs of runs, merged
//   against not): decode 1.5-3.6% faster, the first token 2-17% sooner. (The MLP's SiLU then runs
//   in PyTorch: its gate is a slice of the merged output.)
// - int8 as PT2E leaves them: linear(dequantize(x), dequantize(w), b), w a constant qint8 tensor
//   per output channel, b constants or all None (BERT's q, k and v). The stacked weight keeps each
//   row's codes, scale and zero point, so every output column is computed as before, bit for bit.
//   Merged only where no output is read by an op oneDNN would take into the linear's group (an
//   activation, an add, a quantize: on a slice it could not). Measured (PT2E int8, [1, 128, 768]
//   x three 768 x 768, 2 threads, AMD EPYC Zen 4 with VNNI): 3.9% faster than three groups.
// Either kind only where every reader takes a slice: an aten::view of an output (or of a view of
// it) must only split its last dim (heads), as a view of other strides can; `view(b, -1)` cannot.
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <ATen/ATen.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// The constant [out, in] weight of a bias-free linear of x's dtype, or nullopt.
std::optional<at::Tensor> linear_weight(const Node* n) {
  if (n->kind() != c10::aten::linear || n->inputs().size() != 3) return std::nullopt;
  if (!n->input(2)->type()->isSubtypeOf(*c10::NoneType::get())) return std::nullopt;
  auto w = torch::jit::toIValue(n->input(1));
  auto x = n->input(0)->type()->cast<TensorType>();
  auto out = n->output()->type()->cast<TensorType>();
  if (!w || !w->isTensor() || !x || !x->scalarType() || !out || !out->isComplete()) return std::nullopt;
  const at::Tensor& weight = w->toTensor();
  if (weight.dim() != 2 || weight.scalar_type() != *x->scalarType() || weight.device().type() != c10::kCPU)
    return std::nullopt;
  return weight;
}

// Whether `out`'s sizes are `in`'s with its last dim split into several (a head split), which a
// view of any strides allows.
bool splits_last_dim(const Value* in, const Value* out) {
  auto a = in->type()->cast<TensorType>(), b = out->type()->cast<TensorType>();
  if (!a || !b) return false;
  auto from = a->sizes().concrete_sizes(), to = b->sizes().concrete_sizes();
  if (!from || !to || from->empty() || to->size() < from->size()) return false;
  const size_t leading = from->size() - 1;
  if (!std::equal(from->begin(), from->begin() + leading, to->begin())) return false;
  int64_t split = 1;
  for (size_t i = leading; i < to->size(); ++i) split *= (*to)[i];
  return split == from->back();
}

// Whether every reader of v still works once v is a slice of a wider output (other strides): ops
// read strided tensors, but aten::view needs strides that suit it, which a split of the last dim
// alone always finds. Views of v (transposes, slices, ...) are followed to their readers.
bool strides_free(const Value* v) {
  for (const auto& use : v->uses()) {
    const Node* u = use.user;
    if (u->kind() == c10::aten::view) {
      if (!splits_last_dim(v, u->output()) || !strides_free(u->output())) return false;
      continue;
    }
    if (u->kind() == c10::aten::view_as || u->kind() == c10::aten::as_strided || u->kind() == c10::aten::_unsafe_view)
      return false;
    if (u->kind() == c10::prim::ListUnpack) {
      for (const Value* o : u->outputs())
        if (!strides_free(o)) return false;
      continue;
    }
    const c10::FunctionSchema* schema = u->maybeSchema();
    if (!schema) continue;  // prim ops: lists, tuples, the graph's return
    for (size_t i = 0; i < schema->returns().size() && i < u->outputs().size(); ++i)
      if (schema->returns()[i].alias_info() && !strides_free(u->output(i))) return false;
  }
  return true;
}

// The constant qint8 weight (per output channel, zero points 0, as oneDNN's int8 kernels take it)
// of an int8 linear as PT2E leaves it, with a constant bias of its width or none, or nullopt.
std::optional<at::Tensor> int8_linear_weight(const Node* n) {
  if (n->kind() != c10::aten::linear || n->inputs().size() != 3) return std::nullopt;
  const Node* x = n->input(0)->node();
  const Node* w = n->input(1)->node();
  if (x->kind() != c10::aten::dequantize || w->kind() != c10::aten::dequantize) return std::nullopt;
  auto weight = torch::jit::toIValue(w->input(0));
  if (!weight || !weight->isTensor()) return std::nullopt;
  const at::Tensor& q = weight->toTensor();
  if (q.dim() != 2 || q.scalar_type() != c10::kQInt8 || q.device().type() != c10::kCPU ||
      (q.qscheme() != c10::kPerChannelAffine && q.qscheme() != c10::kPerChannelSymmetric) || q.q_per_channel_axis() != 0 ||
      q.q_per_channel_zero_points().ne(0).any().item<bool>())
    return std::nullopt;
  if (!n->input(2)->type()->isSubtypeOf(*c10::NoneType::get())) {
    auto b = torch::jit::toIValue(n->input(2));
    if (!b || !b->isTensor() || b->toTensor().dim() != 1 || b->toTensor().size(0) != q.size(0) ||
        b->toTensor().scalar_type() != at::kFloat)
      return std::nullopt;
  }
  auto out = n->output()->type()->cast<TensorType>();
  if (!out || !out->isComplete()) return std::nullopt;
  // An output oneDNN would fuse into the linear's group must stay the linear's own.
  for (const auto& use : n->output()->uses())
    if (in_family(use.user, kEltwise | kBinary) || onednn_kind(use.user) == op::kind::Quantize) return std::nullopt;
  return q;
}

std::optional<at::Tensor> constant_bias(const Node* n) {
  auto b = torch::jit::toIValue(n->input(2));
  if (!b || !b->isTensor()) return std::nullopt;
  return b->toTensor();
}

// The linears (with their weights) of one x, in program order.
using Linears = std::vector<std::pair<Node*, at::Tensor>>;

// The int8 weights stacked as one per-channel qint8 tensor; its biases stacked (none if none had one).
std::pair<at::Tensor, std::optional<at::Tensor>> stacked_int8(const Linears& linears) {
  std::vector<at::Tensor> codes, scales, zero_points, biases;
  for (const auto& [n, w] : linears) {
    codes.push_back(w.int_repr());
    scales.push_back(w.q_per_channel_scales());
    zero_points.push_back(w.q_per_channel_zero_points());
    if (auto b = constant_bias(n)) biases.push_back(*b);
  }
  at::Tensor weight = at::_make_per_channel_quantized_tensor(at::cat(codes, 0).contiguous(), at::cat(scales),
                                                             at::cat(zero_points), 0);
  if (biases.empty()) return {weight, std::nullopt};
  return {weight, at::cat(biases).contiguous()};
}

void merge(const std::shared_ptr<Graph>& g, const Linears& linears, bool int8) {
  Node* first = linears.front().first;
  torch::jit::WithInsertPoint point(first);
  Value *w = nullptr, *bias = nullptr;
  if (int8) {
    auto [weight, b] = stacked_int8(linears);
    Node* dequantize = g->create(c10::aten::dequantize, {g->insertConstant(weight)});
    dequantize->insertBefore(first);
    dequantize->output()->setType(first->input(1)->type()->expect<TensorType>()->withSizesStrides(
        {weight.size(0), weight.size(1)}, {weight.size(1), 1}));
    w = dequantize->output();
    bias = g->insertConstant(b ? c10::IValue(*b) : c10::IValue());
  } else {
    std::vector<at::Tensor> weights;
    for (const auto& [n, weight] : linears) weights.push_back(weight);
    w = g->insertConstant(at::cat(weights, 0).contiguous());
    bias = g->insertConstant(c10::IValue());
  }
  auto out = first->output()->type()->expect<TensorType>();
  std::vector<int64_t> sizes = *out->sizes().concrete_sizes();
  sizes.back() = 0;
  for (const auto& [n, weight] : linears) sizes.back() += weight.size(0);  // every linear's columns
  auto contiguous = c10::contiguous_strides(sizes);
  std::vector<int64_t> strides(contiguous.begin(), contiguous.end());  // the merged output's, and its slices'

  Node* merged = g->create(c10::aten::linear, {first->input(0), w, bias});
  merged->insertBefore(first);
  merged->output()->setType(out->withSizesStrides(sizes, strides));
  int64_t start = 0;
  for (const auto& [n, weight] : linears) {
    const int64_t columns = weight.size(0);
    Node* part = g->create(c10::aten::slice, {merged->output(), g->insertConstant(-1), g->insertConstant(start),
                                               g->insertConstant(start + columns), g->insertConstant(1)});
    part->insertBefore(first);
    auto own = n->output()->type()->expect<TensorType>();
    part->output()->setType(own->withSizesStrides(*own->sizes().concrete_sizes(), strides));
    n->output()->replaceAllUsesWith(part->output());
    start += columns;
  }
  for (const auto& [n, weight] : linears) {
    Node* dequantize = int8 ? n->input(1)->node() : nullptr;
    n->destroy();
    // The int8 weights' own dequantize would still run every call, and hold the codes twice.
    if (dequantize && !dequantize->hasUses()) {
      Node* constant = dequantize->input(0)->node();
      dequantize->destroy();
      if (constant->kind() == c10::prim::Constant && !constant->hasUses()) constant->destroy();
    }
  }
}

void merge_block(const std::shared_ptr<Graph>& g, torch::jit::Block* b, const torch::jit::AliasDb& db) {
  for (Node* n : b->nodes())
    for (auto* sub : n->blocks()) merge_block(g, sub, db);
  // The linears of each input that nothing writes in place, of each kind (fp32; int8 with biases;
  // int8 without), whose outputs' readers take a slice, in program order.
  using Key = std::tuple<Value*, bool, bool>;
  std::map<Key, Linears> by_input;
  std::vector<Key> order;
  for (Node* n : b->nodes()) {
    auto weight = linear_weight(n);
    const bool int8 = !weight;
    if (int8) weight = int8_linear_weight(n);
    if (!weight || db.hasWriters(n->input(0)) || !strides_free(n->output())) continue;
    const Key key{n->input(0), int8, int8 && constant_bias(n).has_value()};
    auto& group = by_input[key];
    if (group.empty()) order.push_back(key);
    group.emplace_back(n, *weight);
  }
  for (const auto& key : order) {
    const auto& linears = by_input[key];
    if (linears.size() >= 2) merge(g, linears, std::get<1>(key));
  }
}

}  // namespace

void MergeParallelLinears(std::shared_ptr<Graph>& g) {
  {
    torch::jit::AliasDb db(g);
    merge_block(g, g->block(), db);
  }
  GRAPH_DUMP("After MergeParallelLinears", g);
}

}  // namespace llga
