// SplitChunkedLinears: a linear with constant weights whose output is only chunked along its last
// dim (diffusers' GEGLU: `h, gate = proj(x).chunk(2, -1); h * gelu(gate)`) -> one linear per chunk,
// over that chunk's rows of the weight and bias. A chunk is a strided view of the whole output,
// which oneDNN takes into no partition: the GELU ran in PyTorch on a slice, with copies around it.
// Split, each chunk is a dense output, and oneDNN takes the two linears, the GELU and the product
// into one partition with the next linear. Measured (in-process A/B, 2 threads, AMD EPYC Zen 4,
// AVX2): a GEGLU feed-forward block 0.86-0.94x the time; the bench's diffusion UNet 0.90x and
// 0.945x in two runs of 16 and 12 rounds. Runs before DecomposeOps, which then sees a SiLU
// of a linear's output and spells it out for the post-ops.
// Linears with a bias only: bias-free ones (Phi-3's gate_up_proj) MergeParallelLinears would stack
// again, as it does a decoder's gate and up projections (measured faster for decoding's one row).
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>

#include <ATen/ATen.h>

#include <vector>

#include "jit/codegen/onednn/passes/passes.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// `chunk` is prim::ConstantChunk (the executor's form of `aten::chunk` + `prim::ListUnpack`) of
// linear(x, W, b) along its last dim, W and b constant, nothing else reading or writing the
// linear's output: split it.
void split(const std::shared_ptr<Graph>& g, Node* chunk, const torch::jit::AliasDb& db) {
  Node* linear = chunk->input(0)->node();
  if (linear->kind() != c10::aten::linear || linear->inputs().size() != 3 || linear->output()->uses().size() != 1 ||
      db.hasWriters(linear->output()))
    return;
  const int64_t chunks = chunk->i(c10::attr::chunks), dim = chunk->i(c10::attr::dim);
  auto weight = torch::jit::toIValue(linear->input(1));
  auto bias = torch::jit::toIValue(linear->input(2));
  auto out = linear->output()->type()->cast<TensorType>();
  if (!weight || !weight->isTensor() || !bias || !bias->isTensor() || !out || !out->isComplete())
    return;
  const at::Tensor& w = weight->toTensor();
  const int64_t rank = static_cast<int64_t>(*out->dim());
  if ((dim != -1 && dim != rank - 1) || w.dim() != 2 || chunks < 2 || w.size(0) % chunks != 0 ||
      static_cast<int64_t>(chunk->outputs().size()) != chunks)
    return;
  const int64_t columns = w.size(0) / chunks;
  std::vector<int64_t> sizes = *out->sizes().concrete_sizes();
  sizes.back() = columns;

  torch::jit::WithInsertPoint point(linear);
  for (int64_t i = 0; i < chunks; ++i) {
    Value* wi = g->insertConstant(w.narrow(0, i * columns, columns).contiguous());
    Value* bi = g->insertConstant(bias->toTensor().narrow(0, i * columns, columns).contiguous());
    Node* part = g->create(c10::aten::linear, {linear->input(0), wi, bi});
    part->insertBefore(linear);
    part->output()->setType(out->withSizes(sizes));  // contiguous
    chunk->output(i)->replaceAllUsesWith(part->output());
  }
  chunk->destroy();
  linear->destroy();
}

void split_block(const std::shared_ptr<Graph>& g, torch::jit::Block* b, const torch::jit::AliasDb& db) {
  for (auto it = b->nodes().begin(); it != b->nodes().end();) {
    Node* n = *it++;
    for (auto* sub : n->blocks()) split_block(g, sub, db);
    if (n->kind() == c10::prim::ConstantChunk) split(g, n, db);  // destroys n and its linear, both behind `it`
  }
}

}  // namespace

void SplitChunkedLinears(std::shared_ptr<Graph>& g) {
  {
    torch::jit::AliasDb db(g);
    split_block(g, g->block(), db);
  }
  GRAPH_DUMP("After SplitChunkedLinears", g);
}

}  // namespace llga
