// DecodeAttention: scaled_dot_product_attention of a decoder's step (1-8 queries, fp32 or bf16,
// heads of 64 or 128) -> llga::decode_attention (kernels/decode_attention.h), which reads the KV cache in place.
// Grouped-query heads: where k and v are a cache's heads repeated (transformers' repeat_kv, traced as
//   reshape(expand(unsqueeze(cache[:, :, ...], 2)[:, :, ...], [B, Hkv, n, L, D]), [B, Hkv * n, L, D])
// ) the kernel takes the cache itself and the two size lists, checks at run time that they repeat
// its heads (else it computes the copy as eager does) and skips the copy. The cache is written in
// place every step (index_copy_), which keeps such attention away from oneDNN (decompose_ops.cpp);
// the kernel reads it where the copy did, so no write to it may lie between the two (checked).
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/jit_log.h>

#include <c10/util/strides.h>

#include <limits>
#include <optional>
#include <vector>

#include "jit/codegen/onednn/kernels/decode_attention.h"
#include "jit/codegen/onednn/mapping/sdpa_call.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::TensorType;

// Whether n is x[..., :, ...] as traced: a slice from 0 to the end, step 1 (a view of all of x,
// whatever its sizes).
bool whole_slice(const Node* n) {
  if (n->kind() != c10::aten::slice || n->inputs().size() != 5) return false;
  auto start = torch::jit::toIValue(n->input(2)), end = torch::jit::toIValue(n->input(3));
  auto step = torch::jit::constant_as<int64_t>(n->input(4));
  return start && (start->isNone() || (start->isInt() && start->toInt() == 0)) && end &&
         (end->isNone() || (end->isInt() && end->toInt() >= std::numeric_limits<int32_t>::max())) && step && *step == 1;
}

Value* past_whole_slices(Value* v) {
  while (whole_slice(v->node())) v = v->node()->input(0);
  return v;
}

struct RepeatedHeads {
  Value* source = nullptr;   // [B, Hkv, L, D]
  Value* expanded = nullptr;  // the expand's sizes (int[])
  Value* shape = nullptr;     // the reshape's (int[])
  Node* copy = nullptr;       // the reshape: where eager reads the source
};

// kv as reshape(expand(unsqueeze(source, 2))) with whole slices between, or nullopt.
std::optional<RepeatedHeads> repeated_heads(Value* kv) {
  Node* reshape = kv->node();
  if (reshape->kind() != c10::aten::reshape) return std::nullopt;
  Node* expand = reshape->input(0)->node();
  if (expand->kind() != c10::aten::expand || expand->inputs().size() != 3) return std::nullopt;
  auto implicit = torch::jit::constant_as<bool>(expand->input(2));
  Node* unsqueeze = past_whole_slices(expand->input(0))->node();
  auto dim = unsqueeze->kind() == c10::aten::unsqueeze ? torch::jit::constant_as<int64_t>(unsqueeze->input(1)) : std::nullopt;
  if (!implicit || *implicit || !dim || *dim != 2) return std::nullopt;
  return RepeatedHeads{past_whole_slices(unsqueeze->input(0)), expand->input(1), reshape->input(1), reshape};
}

// Whether a node between `from` and `to` (same block, from first) writes to what v may alias.
bool written_between(const torch::jit::AliasDb& db, Node* from, Node* to, Value* v) {
  if (from->owningBlock() != to->owningBlock() || !from->isBefore(to)) return true;
  for (Node* m = from->next(); m != to; m = m->next())
    if (db.writesToAlias(m, {v})) return true;
  return false;
}

// An attention the kernel takes, with the caches it reads in place where k and v repeat their heads.
struct DecodeStep {
  Node* attention;
  std::optional<RepeatedHeads> k, v;
};

// The attention to rewrite, found before any change (the alias analysis describes the graph as it was).
void find_decode_attention(torch::jit::Block* block, const torch::jit::AliasDb& db, std::vector<DecodeStep>& found) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) find_decode_attention(b, db, found);
    auto call = sdpa_call(n);
    if (!call) continue;
    const auto &qs = call->q_sizes, &ks = call->k_sizes;
    if (ks != call->v_sizes || (call->dtype != at::kFloat && call->dtype != at::kBFloat16) || qs[0] != ks[0] ||
        qs[1] != ks[1] || qs[3] != ks[3] || !decode_attention_runs(qs[3], qs[2]))
      continue;
    auto k = repeated_heads(n->input(1)), v = repeated_heads(n->input(2));
    if (!k || !v || written_between(db, k->copy, n, k->source) || written_between(db, v->copy, n, v->source)) k = v = std::nullopt;
    found.push_back({n, k, v});
  }
}

void take_decode_attention(const DecodeStep& step) {
  Node* n = step.attention;
  Graph* g = n->owningGraph();
  torch::jit::WithInsertPoint point(n);
  Value* none = g->insertConstant(c10::IValue());
  std::vector<Value*> args = {n->input(0), n->input(1), n->input(2), n->input(3), n->input(6), none, none, none, none};
  if (step.k && step.v)
    args = {n->input(0), step.k->source, step.v->source, n->input(3), n->input(6), step.k->expanded, step.k->shape,
            step.v->expanded, step.v->shape};
  auto q = n->input(0)->type()->expect<TensorType>();
  std::vector<int64_t> out_sizes = *q->sizes().concrete_sizes();
  auto strides = c10::contiguous_strides(out_sizes);
  replace_with(n, kDecodeAttention, args)
      ->output()
      ->setType(q->withSizesStrides(out_sizes, std::vector<int64_t>(strides.begin(), strides.end())));
}

}  // namespace

void DecodeAttention(std::shared_ptr<Graph>& g) {
  if (runtime::own_kernels_enabled()) {
    std::vector<DecodeStep> found;
    {
      torch::jit::AliasDb db(g);
      find_decode_attention(g->block(), db, found);
    }
    for (const auto& step : found) take_decode_attention(step);
  }
  GRAPH_DUMP("After DecodeAttention", g);
}

}  // namespace llga
