#include <c10/util/strides.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include "jit/codegen/onednn/op_table.h"
#include "jit/codegen/onednn/passes.h"
#include "jit/codegen/onednn/type_inference.h"

namespace llga {

namespace {

using torch::jit::Match;
using torch::jit::SubgraphRewriter;

// The constant a pattern input matched (vmap names the pattern's values; the match maps them).
std::optional<c10::IValue> matched_constant(const Match& match, const std::unordered_map<std::string, Value*>& vmap,
                                            const char* name) {
  return torch::jit::toIValue(match.values_map.at(vmap.at(name)));
}

// silu(x) = x * sigmoid(x): oneDNN fuses the pair as a binary post-op.
const char* kSilu = R"IR(
graph(%x):
  %r = aten::silu(%x)
  return (%r))IR";
const char* kSiluDecomposed = R"IR(
graph(%x):
  %s = aten::sigmoid(%x)
  %r = aten::mul(%x, %s)
  return (%r))IR";

// addmm(bias, a, b, beta, alpha) = alpha (a @ b) + beta bias; prepare_binary drops the products by 1.
const char* kAddmm = R"IR(
graph(%bias, %a, %b, %beta, %alpha):
  %r = aten::addmm(%bias, %a, %b, %beta, %alpha)
  return (%r))IR";
const char* kAddmmDecomposed = R"IR(
graph(%bias, %a, %b, %beta, %alpha):
  %one : int = prim::Constant[value=1]()
  %mm = aten::mm(%a, %b)
  %scaled = aten::mul(%mm, %alpha)
  %scaled_bias = aten::mul(%bias, %beta)
  %r = aten::add(%scaled, %scaled_bias, %one)
  return (%r))IR";

// Dropout in eval mode is the identity.
void remove_eval_dropout(torch::jit::Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (auto* b : n->blocks()) remove_eval_dropout(b);
    if (n->matches("aten::dropout(Tensor input, float p, bool train) -> Tensor") &&
        torch::jit::constant_as<bool>(n->input(2)) == false) {
      n->output()->replaceAllUsesWith(n->input(0));
      n->destroy();
    }
  }
}

// A decomposition pays only where its ops fuse: after a compute op (as post-ops) or on tensors
// large enough for a group of cheap ops. Elsewhere one aten kernel beats several.
bool large(const Value* v) {
  auto t = v->type()->cast<torch::jit::TensorType>();
  return t && t->numel() && *t->numel() >= kMinElementsForCheapGroup;
}

bool after_compute_op(const Value* v) {
  const OpEntry* e = find_entry(v->node());
  return e && (e->flags & kWorthAlone);
}

// nn.MultiheadAttention's inference fast path, one aten op for self-attention without a mask
// (ViT's encoder), runs its projections as unpacked GEMMs. Spelled out, the projections are linears
// oneDNN fuses with packed weights, and the attention itself is PyTorch's SDPA kernel:
//   qkv = linear(x, in_w, in_b); q, k, v = qkv.chunk(3, -1) -> [B, L, H, D] -> transpose(1, 2)
//   out = linear(sdpa(q, k, v).transpose(1, 2).flatten(2, 3), out_w, out_b)
// Only the values the linears read and write get (profiled-size) types: the rest stay in PyTorch.
void decompose_self_attention(torch::jit::Block* block) {
  static const char* kSchema =
      "aten::_native_multi_head_attention(Tensor query, Tensor key, Tensor value, int embed_dim, int num_head, "
      "Tensor qkv_weight, Tensor qkv_bias, Tensor proj_weight, Tensor proj_bias, Tensor? mask=None, "
      "bool need_weights=True, bool average_attn_weights=True, int? mask_type=None) -> (Tensor, Tensor)";
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (auto* b : n->blocks()) decompose_self_attention(b);
    if (!n->matches(kSchema)) continue;
    Value* x = n->input(0);
    auto type = x->type()->cast<torch::jit::TensorType>();
    auto embed_dim = torch::jit::constant_as<int64_t>(n->input(3));
    auto heads = torch::jit::constant_as<int64_t>(n->input(4));
    bool self_attention = n->input(1) == x && n->input(2) == x;
    bool no_mask = n->input(9)->type()->kind() == c10::TypeKind::NoneType;
    if (!self_attention || !no_mask || n->output(1)->hasUses() || !type || !type->isComplete() ||
        type->dim() != 3 || !embed_dim || !heads || *heads <= 0 || *embed_dim % *heads != 0)
      continue;
    auto sizes = *type->sizes().concrete_sizes();
    if (sizes[2] != *embed_dim) continue;
    auto typed = [&](Value* v, std::vector<int64_t> s) {
      return v->setType(c10::TensorType::create(*type->scalarType(), *type->device(), c10::IntArrayRef(s),
                                                c10::IntArrayRef(c10::contiguous_strides(s)), false));
    };
    Graph* g = block->owningGraph();
    torch::jit::WithInsertPoint point(n);
    Value* qkv = typed(g->insert(c10::aten::linear, {x, n->input(5), n->input(6)}), {sizes[0], sizes[1], 3 * sizes[2]});
    Node* chunks = g->createListUnpack(g->insert(c10::aten::chunk, {qkv, 3, -1}), 3);
    g->insertNode(chunks);
    std::vector<Value*> qkv_heads;
    for (Value* part : chunks->outputs()) {
      Value* split = g->insert(c10::aten::unflatten, {part, -1, std::vector<int64_t>{*heads, *embed_dim / *heads}});
      qkv_heads.push_back(g->insert(c10::aten::transpose, {split, 1, 2}));
    }
    Value* attention = g->insert(c10::aten::scaled_dot_product_attention, {qkv_heads[0], qkv_heads[1], qkv_heads[2]});
    Value* merged = typed(g->insert(c10::aten::flatten, {g->insert(c10::aten::transpose, {attention, 1, 2}), 2, 3}), sizes);
    Value* out = g->insert(c10::aten::linear, {merged, n->input(7), n->input(8)});
    out->setType(n->output(0)->type());
    n->output(0)->replaceAllUsesWith(out);
    n->destroy();
  }
}

}  // namespace

void DecomposeOps(std::shared_ptr<Graph>& g) {
  decompose_self_attention(g->block());

  SubgraphRewriter silu;
  silu.RegisterRewritePattern(kSilu, kSiluDecomposed);
  silu.runOnGraph(g, [](const Match& match, const std::unordered_map<std::string, Value*>& vmap) {
    Value* x = match.values_map.at(vmap.at("x"));
    return after_compute_op(x) || large(x);
  });

  SubgraphRewriter addmm;
  addmm.RegisterRewritePattern(kAddmm, kAddmmDecomposed);
  addmm.runOnGraph(g, [](const Match& match, const std::unordered_map<std::string, Value*>& vmap) {
    // beta == 0 means "ignore bias" (NaN in it included): keep addmm then.
    // And a matrix-vector addmm stays whole: its mm would not map (see op_table's matmul).
    auto beta = matched_constant(match, vmap, "beta");
    auto alpha = matched_constant(match, vmap, "alpha");
    auto out = match.values_map.at(vmap.at("r"))->type()->cast<torch::jit::TensorType>();
    auto sizes = out ? out->sizes().concrete_sizes() : std::nullopt;
    return beta && alpha && beta->isScalar() && alpha->isScalar() && beta->toScalar().toDouble() != 0 && sizes &&
           !sizes->empty() && sizes->back() > 1;
  });

  remove_eval_dropout(g->block());
  fill_missing_types(g->block());
  GRAPH_DUMP("After DecomposeOps", g);
}

}  // namespace llga
