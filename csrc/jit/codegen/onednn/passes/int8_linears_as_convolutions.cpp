// Int8LinearsAsConvolutions: an int8 linear of 1 to 16 rows (a classifier's head: ResNet's and MobileNet's
// last layer) on a CPU without VNNI -> a 1x1 int8 convolution over the same memory:
//   linear(dequantize(x), dequantize(w), b)  [M, K] x [N, K]
//   -> reshape(conv2d(dequantize(reshape(x, [-1, K, 1, 1])), dequantize(w as [N, K, 1, 1]), b),
//              x.size()[:-1] + [N])
// There oneDNN runs an int8 matmul of a few rows as its generic integer GEMM, which copies the
// whole weight into its packed form on every call; its 1x1 convolution packs the weight once (the
// constant cache) and reads it as it is. Measured (AMD EPYC Zen 3, AVX2, 2 threads, [M, 2048] x
// [1000, 2048], per primitive): M=1 95 -> 38 us, M=4 293 -> 106, M=16 450 -> 318, M=64 level.
// Where oneDNN takes the weights as int8 (u8 codes below 128 here: int8_weights_exact) both sum
// the same integer products exactly and scale them alike, so the results are equal; elsewhere both
// compute in fp32 from the same dequantized weights (equal within fp32 rounding).
// With VNNI oneDNN's matmul packs int8 weights once too: the linears stay as they are. Also left
// alone: a linear whose output a mapped op reads (an activation, an add, the next quantize): those
// would be its post-ops, and the reshape between them and the conv would split them off.
// The reshapes run in PyTorch, outside the group's guard, so they keep any call right: the input's
// leading dims are flattened into rows and the output takes them back (a call of another rank
// included), as linear does.
// After PrepareQuantization (the dequantizes' recorded parameters stay on them) and before the fuser.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "onednn/torch_onednn.h"

namespace llga {

namespace {

using torch::jit::TensorType;

constexpr int64_t kMaxRows = 16;

// dequantize(x) of a quantized activation whose parameters PrepareQuantization recorded, read by
// the linear alone.
bool is_recorded_dequantize(const Value* v) {
  const Node* d = v->node();
  return d->kind() == c10::aten::dequantize && d->hasAttribute(kQuantScale) && v->uses().size() == 1;
}

// dequantize(w) of a constant per-channel (or per-tensor) quantized 2-D weight, read by the linear alone.
std::optional<at::Tensor> quantized_weight(const Value* v) {
  const Node* d = v->node();
  if (d->kind() != c10::aten::dequantize || v->uses().size() != 1) return std::nullopt;
  auto w = torch::jit::toIValue(d->input(0));
  if (!w || !w->isTensor() || !w->toTensor().is_quantized() || w->toTensor().dim() != 2) return std::nullopt;
  return w->toTensor();
}

// Whether an op oneDNN would take reads y (it would be the linear's post-op).
bool read_by_mapped_ops(const Value* y) {
  const auto& uses = y->uses();
  return std::any_of(uses.begin(), uses.end(), [](const torch::jit::Use& use) { return map_node(use.user).has_value(); });
}

bool row_linear(const Node* n) {
  if (n->kind() != c10::aten::linear || n->inputs().size() != 3 || !is_recorded_dequantize(n->input(0)) ||
      !quantized_weight(n->input(1)))
    return false;
  auto x = n->input(0)->type()->cast<TensorType>();
  auto xq = n->input(0)->node()->input(0)->type()->cast<TensorType>();
  auto y = n->output()->type()->cast<TensorType>();
  if (!x || !x->isComplete() || *x->dim() != 2 || !xq || !xq->isComplete() || !y || !y->isComplete()) return false;
  int64_t rows = *x->sizes()[0];
  return rows >= 1 && rows <= kMaxRows && !read_by_mapped_ops(n->output());
}

TensorType::TypePtr contiguous_type(at::ScalarType dtype, std::vector<int64_t> sizes) {
  return TensorType::createContiguous(dtype, at::kCPU, sizes);
}

void take(const std::shared_ptr<Graph>& g, Node* n) {
  Node* dx = n->input(0)->node();
  Node* dw = n->input(1)->node();
  auto x = n->input(0)->type()->expect<TensorType>();
  auto xq = dx->input(0)->type()->expect<TensorType>();
  const at::Tensor w = *quantized_weight(n->input(1));
  const int64_t rows = *x->sizes()[0], k = w.size(1), outs = w.size(0);

  Value* x_codes = dx->input(0);
  torch::jit::WithInsertPoint point(dx);
  Node* reshape = g->create(c10::aten::reshape, {x_codes, g->insertConstant(c10::IntArrayRef{-1, k, 1, 1})});
  reshape->insertBefore(dx);
  reshape->output()->setType(contiguous_type(*xq->scalarType(), {rows, k, 1, 1}));
  dx->replaceInput(0, reshape->output());
  dx->output()->setType(contiguous_type(at::kFloat, {rows, k, 1, 1}));

  torch::jit::WithInsertPoint at_weight(dw);
  dw->replaceInput(0, g->insertConstant(w.reshape({outs, k, 1, 1})));
  dw->output()->setType(contiguous_type(at::kFloat, {outs, k, 1, 1}));

  torch::jit::WithInsertPoint at_linear(n);
  auto ones = g->insertConstant(c10::IntArrayRef{1, 1});
  Node* conv = g->create(c10::aten::conv2d, {dx->output(), dw->output(), n->input(2), ones,
                                             g->insertConstant(c10::IntArrayRef{0, 0}), ones, g->insertConstant(1)});
  conv->insertBefore(n);
  conv->output()->setType(contiguous_type(at::kFloat, {rows, outs, 1, 1}));
  // The output's sizes: the input's but the last, then N.
  Value* leading = g->insert(c10::aten::slice, {g->insert(c10::aten::size, {x_codes}), 0, -1, 1});
  Value* sizes = g->insert(c10::aten::add, {leading, g->insertConstant(c10::IntArrayRef{outs})});
  replace_with(n, c10::aten::reshape, {conv->output(), sizes});
}

void find(torch::jit::Block* block, std::vector<Node*>& found) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) find(b, found);
    if (row_linear(n)) found.push_back(n);
  }
}

}  // namespace

void Int8LinearsAsConvolutions(std::shared_ptr<Graph>& g) {
  if (!onednn::cpu().int8_vnni) {
    std::vector<Node*> found;
    find(g->block(), found);
    for (Node* n : found) take(g, n);
  }
  GRAPH_DUMP("After Int8LinearsAsConvolutions", g);
}

}  // namespace llga
