// RowLinears: a linear of one to four rows (a decoder's step: a token a sequence) over a large
// constant fp32 or bf16 weight -> llga::row_linear (kernels/row_linear.h), which streams the weight at the
// memory's rate, where oneDNN's one-row matmul reaches about two thirds of it; with the RMSNorm
// before it, where the linear alone reads the norm, llga::rms_norm_row_linear (a oneDNN RMSNorm
// partition of one row cost ~25 us, its math well under one). It runs after MergeParallelLinears
// (the merged q/k/v and gate/up weights are the ones to stream) and PlanSmallGraph (a graph of tiny
// tensors stays one plan), before the fuser, which leaves the ops to PyTorch's interpreter (a
// residual add after them then runs in PyTorch: a few hundred floats). The rows are the profiled
// ones; a call with more runs at::linear. Measured on generate() of a SmolLM2-135M-shaped Llama
// (fp32, static cache, 2 threads, AMD EPYC Zen 3, AVX2): see row_linear.cpp and BENCHMARKS.md.
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <ATen/ATen.h>

#include <vector>

#include "jit/codegen/onednn/kernels/row_linear.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"
#include "onednn/torch_onednn.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// The linear's profiled rows (the product of x's sizes but the last), or 0 when unknown or x is
// not of the weight's dtype.
int64_t profiled_rows(const Value* x, at::ScalarType dtype) {
  auto t = x->type()->cast<TensorType>();
  if (!t || !t->isComplete() || t->scalarType() != dtype || !t->dim() || *t->dim() == 0) return 0;
  int64_t rows = 1;
  auto sizes = *t->sizes().concrete_sizes();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) rows *= sizes[i];
  return rows;
}

// The aten::rms_norm over the last dim (of `size` values) that produced x, where the linear is all
// that reads it and nothing writes the norm's input between the two (the fused op reads it where
// the linear was); else nullptr.
Node* rms_norm_of_last_dim(Value* x, int64_t size, const torch::jit::AliasDb& db) {
  Node* norm = x->node();
  if (norm->kind() != c10::aten::rms_norm || norm->inputs().size() != 4 || x->uses().size() != 1) return nullptr;
  Node* linear = x->uses()[0].user;
  if (norm->owningBlock() != linear->owningBlock()) return nullptr;
  for (Node* m = norm->next(); m != linear; m = m->next())
    if (db.writesToAlias(m, {norm->input(0)})) return nullptr;
  auto shape = torch::jit::toIValue(norm->input(1));
  if (!shape || !shape->isIntList() || shape->toIntList().size() != 1 || shape->toIntList().get(0) != size) return nullptr;
  auto eps = torch::jit::toIValue(norm->input(3));
  if (!eps || !(eps->isNone() || eps->isDouble())) return nullptr;
  return norm;
}

// A linear the kernel takes, with the RMSNorm it folds in (or nullptr).
struct RowLinear {
  Node* linear;
  Node* norm;
};

// The linears to rewrite, found before any change (the alias analysis describes the graph as it was).
void find_row_linears(torch::jit::Block* block, const torch::jit::AliasDb& db, std::vector<RowLinear>& found) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) find_row_linears(b, db, found);
    if (n->kind() != c10::aten::linear || n->inputs().size() != 3) continue;
    auto w = torch::jit::toIValue(n->input(1));
    auto b = torch::jit::toIValue(n->input(2));
    auto out = n->output()->type()->cast<TensorType>();
    if (!w || !w->isTensor() || !b || !(b->isNone() || b->isTensor()) || !out || !out->isComplete()) continue;
    const at::Tensor& weight = w->toTensor();
    const auto dtype = weight.scalar_type();
    // fp32 and bf16: whether the kernel or PyTorch's linear (oneDNN's bf16 matmul where it has
    // bf16 kernels) runs is measured at the first call (choice site row_linear).
    bool bf16_ok = dtype == at::kBFloat16;
    if (weight.dim() != 2 || (dtype != at::kFloat && !bf16_ok) || !weight.device().is_cpu() ||
        !row_linear_runs(profiled_rows(n->input(0), dtype), weight.size(0), weight.size(1)))
      continue;
    if (b->isTensor() && (b->toTensor().scalar_type() != dtype || b->toTensor().dim() != 1)) continue;
    found.push_back({n, rms_norm_of_last_dim(n->input(0), weight.size(1), db)});
  }
}

void take_row_linear(const std::shared_ptr<Graph>& g, const RowLinear& r) {
  Node* n = r.linear;
  const at::Tensor weight = torch::jit::toIValue(n->input(1))->toTensor();
  auto b = torch::jit::toIValue(n->input(2));
  torch::jit::WithInsertPoint point(n);
  Value* weight_value = weight.is_contiguous() ? n->input(1) : g->insertConstant(weight.contiguous());
  Value* bias_value = b->isTensor() && !b->toTensor().is_contiguous() ? g->insertConstant(b->toTensor().contiguous())
                                                                      : n->input(2);
  Node* norm = runtime::switched_off("rms_norm_row_linear") ? nullptr : r.norm;
  if (norm) {
    replace_with(n, kRmsNormRowLinear, {norm->input(0), norm->input(2), norm->input(3), weight_value, bias_value});
    norm->destroy();
  } else {
    replace_with(n, kRowLinear, {n->input(0), weight_value, bias_value});
  }
}

}  // namespace

void RowLinears(std::shared_ptr<Graph>& g) {
  if (runtime::own_kernels_enabled()) {
    std::vector<RowLinear> found;
    {
      torch::jit::AliasDb db(g);
      find_row_linears(g->block(), db, found);
    }
    for (const auto& r : found) take_row_linear(g, r);
  }
  GRAPH_DUMP("After RowLinears", g);
}

}  // namespace llga
