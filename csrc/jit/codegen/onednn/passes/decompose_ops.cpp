#include <ATen/ATen.h>
#include <c10/util/strides.h>

#include <cmath>
#include <limits>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include "jit/codegen/onednn/kernels/attention_ops.h"
#include "jit/codegen/onednn/kernels/head64_attention.h"
#include "jit/codegen/onednn/kernels/onednn_attention.h"
#include "jit/codegen/onednn/kernels/small_head_attention.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/mapping/sdpa_call.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/passes/type_inference.h"
#include "jit/codegen/onednn/settings/settings.h"
#include "onednn/torch_onednn.h"

namespace llga {

std::optional<c10::IValue> matched_constant(const torch::jit::Match& match,
                                            const std::unordered_map<std::string, Value*>& vmap, const char* name) {
  auto it = vmap.find(name);
  return it == vmap.end() ? std::nullopt : torch::jit::toIValue(match.values_map.at(it->second));
}

namespace {

using torch::jit::Match;
using torch::jit::SubgraphRewriter;

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

// A complete tensor type of these sizes and strides (a decomposition's new values need profiled
// types for the op table to map them).
Value* typed(Value* v, const torch::jit::TensorType& like, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  return v->setType(c10::TensorType::create(*like.scalarType(), *like.device(), c10::IntArrayRef(sizes),
                                            c10::IntArrayRef(strides), false));
}

std::vector<int64_t> contiguous(const std::vector<int64_t>& sizes) {
  auto s = c10::contiguous_strides(sizes);
  return {s.begin(), s.end()};
}

// Whether an attention of this dtype and these sizes runs one of torch_llga's own kernels (kernels/),
// which read strided q, k and v views; oneDNN's is handed dense ones.
bool own_attention_kernel(c10::ScalarType dtype, int64_t head_size, int64_t queries, int64_t keys, bool masked) {
  return runtime::own_kernels_enabled() &&
         ((dtype == at::kFloat && !masked && small_head_attention_runs(head_size, keys) &&
           !runtime::switched_off("small_head_attention")) ||
          (head64_attention_runs(dtype, head_size, queries, keys) && !runtime::switched_off("head64_attention")));
}

// nn.MultiheadAttention's inference fast path, one aten op for self-attention without a mask
// (ViT's encoder), runs its projections as unpacked GEMMs. Spelled out, the projections are linears
// oneDNN fuses with packed weights, and the attention an SDPA that decompose_sdpa takes next:
//   qkv = linear(x, in_w, in_b); q, k, v = qkv.chunk(3, -1) -> [B, L, H, D] -> transpose(1, 2)
//   out = linear(sdpa(q, k, v).transpose(1, 2).flatten(2, 3), out_w, out_b)
// With constant in_w and in_b (a frozen module), unless torch_llga's own kernel takes the
// attention (it reads strided views), q, k and v are three linears over in_w's thirds instead.
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
    Graph* g = block->owningGraph();
    torch::jit::WithInsertPoint point(n);
    int64_t head_dim = *embed_dim / *heads;
    std::vector<Value*> parts;  // q, k and v: [B, L, E] each
    auto w = torch::jit::toIValue(n->input(5)), b = torch::jit::toIValue(n->input(6));
    auto stacked = [&](const std::optional<c10::IValue>& v, int64_t dim) {  // a strided [3E] or [3E, E] constant of x's dtype
      if (!v || !v->isTensor()) return false;
      const at::Tensor& t = v->toTensor();
      return t.layout() == at::kStrided && t.scalar_type() == *type->scalarType() && t.dim() == dim &&
             t.size(0) == 3 * sizes[2];
    };
    bool split = !own_attention_kernel(*type->scalarType(), head_dim, sizes[1], sizes[1], false) && stacked(w, 2) &&
                 stacked(b, 1);
    if (split) {
      // oneDNN's attention is handed strided q, k and v as dense copies (below): three projections
      // over the weight's thirds give dense ones, no copies (three a layer, ~0.1 ms on ViT-B/16
      // bf16). The whole ViT-B/16 bf16 (AMD EPYC Zen 4, 2 threads, in-process A/B, 16 rounds):
      // 0.6% less time a call, within that guest's +-10% spread between rounds.
      for (int64_t i = 0; i < 3; ++i) {
        Value* wi = g->insertConstant(w->toTensor().narrow(0, i * sizes[2], sizes[2]).contiguous());
        Value* bi = g->insertConstant(b->toTensor().narrow(0, i * sizes[2], sizes[2]).contiguous());
        parts.push_back(typed(g->insert(c10::aten::linear, {x, wi, bi}), *type, sizes, contiguous(sizes)));
      }
    } else {
      std::vector<int64_t> qkv_sizes = {sizes[0], sizes[1], 3 * sizes[2]};
      Value* qkv = typed(g->insert(c10::aten::linear, {x, n->input(5), n->input(6)}), *type, qkv_sizes, contiguous(qkv_sizes));
      Node* chunks = g->createListUnpack(g->insert(c10::aten::chunk, {qkv, 3, -1}), 3);
      g->insertNode(chunks);
      parts.assign(chunks->outputs().begin(), chunks->outputs().end());
    }
    int64_t row = split ? sizes[2] : 3 * sizes[2];  // the stride of a position in q, k and v
    std::vector<Value*> qkv_heads;
    for (Value* part : parts) {
      Value* heads_split = g->insert(c10::aten::unflatten, {part, -1, std::vector<int64_t>{*heads, head_dim}});
      // [B, H, L, D], a view: typed, so that decompose_sdpa spells the attention out.
      qkv_heads.push_back(typed(g->insert(c10::aten::transpose, {heads_split, 1, 2}), *type,
                                {sizes[0], *heads, sizes[1], head_dim}, {sizes[1] * row, head_dim, row, 1}));
    }
    Value* attention = g->insert(c10::aten::scaled_dot_product_attention, {qkv_heads[0], qkv_heads[1], qkv_heads[2]});
    Value* merged = typed(g->insert(c10::aten::flatten, {g->insert(c10::aten::transpose, {attention, 1, 2}), 2, 3}), *type, sizes,
                           contiguous(sizes));
    Value* out = g->insert(c10::aten::linear, {merged, n->input(7), n->input(8)});
    out->setType(n->output(0)->type());
    n->output(0)->replaceAllUsesWith(out);
    n->destroy();
  }
}

const c10::Symbol kSoftmaxInfAsZero = c10::Symbol::fromQualString("llga::softmax_inf_as_zero");
const c10::Symbol kSdpaScale = c10::Symbol::fromQualString("llga::sdpa_scale");

// scaled_dot_product_attention(q, k, v, mask) spelled out as oneDNN's SDPA pattern, which it runs as
// one fused kernel (measured here, 12 heads x 64, as a group against PyTorch's SDPA: fp32 on par for
// dense inputs, 0.41-0.51 against 0.42-0.57 ms at 128 tokens; bf16 2x, 0.55-0.59 against 1.1-1.3 ms
// at 197):
//   softmax(matmul(q, k^T) * scale [+ mask | + attention_bias(mask)], -1) @ v
// (with a mask, softmax_inf_as_zero: a fully masked row attends to nothing, as in PyTorch's kernel)
// Inference only (dropout 0), not causal, no grouped-query heads, rank-4 q/k/v of one float dtype
// with profiled sizes; a float mask is added, a boolean one as its attention_bias (True: attend). The scale is a
// [1, 1, 1, 1] tensor (oneDNN 3.12 compiles no SDPA with a 1-D one): sdpa_scale(q, scale).
// Unmasked fp32 heads of 8 or 16 over 512 keys or more are torch_llga's own kernel's node instead
// (llga::small_head_attention), and so are fp32 heads of 64, 96+ queries over 128+ keys, masked or
// not (llga::head64_attention; bf16 ones too where the CPU has AVX512_BF16 and no AMX): at run time
// each call's sizes choose between the kernel, oneDNN's SDPA and PyTorch's by timing them (choice
// sites of the same names). The node reads q, k, v and the mask through their strides, so their
// copies made for the attention are skipped, and a boolean mask as it is, no bias made; other unmasked fp32
// attention over 1,024 keys or more stays PyTorch's (kFlashAttentionMinKeys).
// Not where q, k, v or the mask is written in place anywhere: the fuser maps no op whose tensors
// are (graph_fuser.cpp), so the spelled-out ops would stay in PyTorch, the softmax alone a group
// whose guard then sends every masked call (-inf scores) to its fallback (fuzzing).
// Unmasked fp32 attention over this many keys or more that no own kernel takes is
// llga::long_attention: PyTorch's flash kernel (its default) or oneDNN's SDPA, timed at run time
// (oneDNN's took 1.2-1.3x the flash kernel's time there on one AVX2 CPU, level at 512 keys and below).
// With own kernels off, PyTorch's SDPA.
constexpr int64_t kFlashAttentionMinKeys = 1024;
const char* kNoBf16KernelsReason = "oneDNN has no bf16 kernels on this CPU: PyTorch's attention kernel";
const char* kFlashAttentionReason =
    "PyTorch's flash attention kernel is faster than oneDNN's SDPA over 1,024 keys or more (fp32, unmasked)";

// Whether every use of a 4-D attention output is transpose(1, 2) (or (2, 1), (-3, -2), ...), maybe
// after a reshape or view to the same sizes (transformers' sdpa_attention_forward reshapes first),
// besides reads of its sizes.
bool merges_heads(const Value* out) {
  if (out->uses().empty()) return false;
  auto sizes = out->type()->cast<torch::jit::TensorType>() ? out->type()->expect<torch::jit::TensorType>()->sizes().concrete_sizes()
                                                             : std::nullopt;
  for (const auto& use : out->uses()) {
    const Node* t = use.user;
    if (t->kind() == c10::aten::size || t->kind() == c10::aten::dim) continue;  // reads sizes only
    if ((t->kind() == c10::aten::reshape || t->kind() == c10::aten::view) && use.offset == 0 && sizes) {
      auto r = t->output()->type()->cast<torch::jit::TensorType>();
      if (!r || r->sizes().concrete_sizes() != sizes || !merges_heads(t->output())) return false;
      continue;
    }
    if (t->kind() != c10::aten::transpose || use.offset != 0) return false;
    auto a = torch::jit::constant_as<int64_t>(t->input(1)), b = torch::jit::constant_as<int64_t>(t->input(2));
    if (!a || !b) return false;
    int64_t lo = std::min((*a + 4) % 4, (*b + 4) % 4), hi = std::max((*a + 4) % 4, (*b + 4) % 4);
    if (lo != 1 || hi != 2) return false;
  }
  return true;
}

void decompose_sdpa(torch::jit::Block* block, const torch::jit::AliasDb& db) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (auto* b : n->blocks()) decompose_sdpa(b, db);
    auto call = sdpa_call(n);
    if (!call) continue;
    if (std::any_of(n->inputs().begin(), n->inputs().begin() + 4,
                    [&](const Value* v) { return v->type()->cast<torch::jit::TensorType>() && db.hasWriters(v); }))
      continue;
    auto q = n->input(0)->type()->cast<torch::jit::TensorType>(), k = n->input(1)->type()->cast<torch::jit::TensorType>(),
         v = n->input(2)->type()->cast<torch::jit::TensorType>();
    if (!q->isComplete() || !k->isComplete() || !v->isComplete() || !to_dnnl_dtype(call->dtype) ||
        q->scalarType() != k->scalarType() || q->scalarType() != v->scalarType())
      continue;
    if (q->scalarType() == at::kBFloat16 && !onednn::cpu().bf16) {  // spelled out, its ops would be eager's bf16 ones
      n->s_(kUnfusedReason, kNoBf16KernelsReason);
      continue;
    }
    const auto &qs = call->q_sizes, &ks = call->k_sizes, &vs = call->v_sizes;
    auto dense = [](const torch::jit::TensorType& t) {  // a meta tensor: sizes and strides only
      return at::empty_strided(*t.sizes().concrete_sizes(), *t.strides().concrete_sizes(), at::TensorOptions().device(at::kMeta))
          .is_non_overlapping_and_dense();
    };
    if (qs[0] != ks[0] || qs[1] != ks[1] || ks[0] != vs[0] || ks[1] != vs[1] || qs[3] != ks[3] || ks[2] != vs[2]) continue;
    Value* mask = n->input(3);
    const bool has_mask = call->mask != nullptr;
    bool bool_mask = false;
    if (has_mask) {
      auto m = mask->type()->cast<torch::jit::TensorType>();
      if (!m || !m->isComplete() || m->dim() != 4) continue;
      bool_mask = m->scalarType() == c10::ScalarType::Bool;
      if (!bool_mask && m->scalarType() != q->scalarType()) continue;
    }
    auto options = at::TensorOptions().dtype(*q->scalarType());

    Graph* g = block->owningGraph();
    torch::jit::WithInsertPoint point(n);
    // The own kernel reads a mask broadcast to the scores' sizes ([B, H, Q] as q's, then the keys)
    // through its strides, its rows contiguous: another (broadcast over the keys, transposed) is
    // left to the rest of this pass.
    auto readable_mask = [&] {
      auto m = mask->type()->cast<torch::jit::TensorType>();
      auto sizes = m->sizes().concrete_sizes();
      auto strides = m->strides().concrete_sizes();
      if (!sizes || !strides || (*sizes)[3] != ks[2] || (*strides)[3] != 1) return false;
      for (int i = 0; i < 3; ++i)
        if ((*sizes)[i] != 1 && (*sizes)[i] != qs[i]) return false;
      return true;
    };
    if (vs[3] == qs[3] && own_attention_kernel(*q->scalarType(), qs[3], qs[2], ks[2], has_mask) &&
        (!has_mask || readable_mask())) {
      // Heads of 8 or 16, or of 64, over many keys: torch_llga's kernels (kernels/).
      c10::Symbol kernel = qs[3] == 64 ? kHead64Attention : kSmallHeadAttention;
      std::vector<torch::jit::NamedValue> args = {n->input(0), n->input(1), n->input(2)};
      if (kernel == kHead64Attention) args.emplace_back(n->input(3));  // the mask, or None
      args.emplace_back(n->input(6));
      // They read strided views: a copy made for the attention is not needed (a copy whose source is
      // written in place counts as written itself, for the alias analysis: such attention stays above).
      for (size_t i = 0; i < 3; ++i) {
        Node* copy = n->input(i)->node();
        if (copy->kind() == c10::aten::contiguous) args[i] = copy->input(0);
      }
      // head64_attention writes [B, L, H, D] memory where only transpose(1, 2)s read the result (the
      // heads' merge after it is then a view); contiguous where anything else may (a view() of it).
      bool merged_heads = kernel == kHead64Attention && merges_heads(n->output());
      if (kernel == kHead64Attention) args.emplace_back(merged_heads);
      Value* out = g->insert(kernel, args);
      std::vector<int64_t> out_sizes = {qs[0], qs[1], qs[2], vs[3]};
      std::vector<int64_t> out_strides = merged_heads ? std::vector<int64_t>{qs[2] * qs[1] * vs[3], vs[3], qs[1] * vs[3], 1}
                                                      : contiguous(out_sizes);
      typed(out, *q, out_sizes, out_strides);
      n->output()->replaceAllUsesWith(out);
      n->destroy();
      continue;
    }
    if (!has_mask && q->scalarType() == at::kFloat && ks[2] >= kFlashAttentionMinKeys) {
      if (!runtime::own_kernels_enabled() || runtime::switched_off("long_attention")) {
        n->s_(kUnfusedReason, kFlashAttentionReason);
        continue;
      }
      // PyTorch's flash kernel or oneDNN's SDPA, measured at run time (llga::long_attention).
      bool merged_heads = merges_heads(n->output());
      Value* out = g->insert(kLongAttention, {n->input(0), n->input(1), n->input(2), n->input(6), merged_heads});
      std::vector<int64_t> out_sizes = {qs[0], qs[1], qs[2], vs[3]};
      typed(out, *q, out_sizes,
            merged_heads ? std::vector<int64_t>{qs[2] * qs[1] * vs[3], vs[3], qs[1] * vs[3], 1} : contiguous(out_sizes));
      n->output()->replaceAllUsesWith(out);
      n->destroy();
      continue;
    }
    Node* before = n->prev();  // what is inserted from here on lies between it and n
    std::vector<Value*> original(n->inputs().begin(), n->inputs().end());
    // Strided views (of one QKV projection not split above: a module not frozen) are made
    // contiguous first, in PyTorch: oneDNN's kernel wins even so. bf16, ViT's 12 x 197 x 64: 0.58
    // against PyTorch's 1.26 ms (Zen 4). fp32, all of ViT-B/16: 1.06x and 1.07x in two in-process A/B runs, 12 rounds each, either build
    // prepared first (AMD EPYC Zen 5, 2 threads; one such attention layer alone: 1.00-1.02x at 64 to
    // 384 tokens). (On Zen 4 an fp32 BERT-base with such views had lost, 9.3 against 8.8 ms for its
    // 12 attentions; its q, k and v are dense now, from three projections.)
    for (size_t i = 0; i < 3; ++i) {
      auto t = n->input(i)->type()->expect<torch::jit::TensorType>();
      if (dense(*t)) continue;
      auto sizes = *t->sizes().concrete_sizes();
      n->replaceInput(i, typed(g->insert(c10::aten::contiguous, {n->input(i)}), *t, sizes, contiguous(sizes)));
    }
    k = n->input(1)->type()->cast<torch::jit::TensorType>();
    auto kst = *k->strides().concrete_sizes();
    Value* kt = typed(g->insert(c10::aten::transpose, {n->input(1), -2, -1}), *k, {ks[0], ks[1], ks[3], ks[2]},
                      {kst[0], kst[1], kst[3], kst[2]});
    std::vector<int64_t> score_sizes = {qs[0], qs[1], qs[2], ks[2]};
    Value* scores = typed(g->insert(c10::aten::matmul, {n->input(0), kt}), *q, score_sizes, contiguous(score_sizes));
    Value* factor = g->insert(kSdpaScale, {n->input(0), n->input(6)});
    factor->setType(c10::TensorType::create(at::full(sdpa_scale_sizes(), 1.0, options)));
    scores = typed(g->insert(c10::aten::mul, {scores, factor}), *q, score_sizes, contiguous(score_sizes));
    if (bool_mask) {
      // Added, not selected: oneDNN runs the scores' matmul with a select post-op as a plain gemm,
      // 3.6x slower than its brgemm with an add (BERT-base's 12 x 128 x 64, bf16, measured).
      auto mask_sizes = *mask->type()->expect<torch::jit::TensorType>()->sizes().concrete_sizes();
      Value* bias = typed(g->insert(kAttentionBias, {mask, n->input(0)}), *q, mask_sizes, contiguous(mask_sizes));
      scores = typed(g->insert(c10::aten::add, {scores, bias}), *q, score_sizes, contiguous(score_sizes));
    } else if (has_mask) {
      scores = typed(g->insert(c10::aten::add, {scores, mask}), *q, score_sizes, contiguous(score_sizes));
    }
    // With a mask, a row may be all -inf: PyTorch's SDPA gives 0 there, softmax NaN.
    Value* probs = has_mask ? g->insert(kSoftmaxInfAsZero, {scores, -1}) : g->insert(c10::aten::softmax, {scores, -1, c10::IValue()});
    typed(probs, *q, score_sizes, contiguous(score_sizes));
    std::vector<int64_t> out_sizes = {qs[0], qs[1], qs[2], vs[3]};
    // Where only the heads' merge (transpose(1, 2)) reads it, the output is written in [B, L, H, D]
    // memory: the merge and the contiguous() and reshape after it are then views, not a copy a layer.
    std::vector<int64_t> out_strides = merges_heads(n->output())
                                           ? std::vector<int64_t>{qs[2] * qs[1] * vs[3], vs[3], qs[1] * vs[3], 1}
                                           : contiguous(out_sizes);
    Value* out = typed(g->insert(c10::aten::matmul, {probs, n->input(2)}), *q, out_sizes, out_strides);
    // Spelled out only where oneDNN can take every op of it (its matmuls with one column of output
    // cannot: quirks::matrix_vector_product): a part left to PyTorch would be slower than PyTorch's
    // SDPA, and the -inf of a masked score would reach a group's guard, which sends it to the fallback.
    bool mapped = true;
    for (Node* m = out->node(); m != before && mapped; m = m->prev())
      if (in_family(m, kWorthAlone | kBinary))  // the matmuls, softmax, scale and mask: not the layouts
        mapped = map_node(m).has_value();
    if (!mapped) {
      for (size_t i = 0; i < original.size(); ++i) n->replaceInput(i, original[i]);
      for (Node* m = n->prev(); m != before;) {
        Node* prev = m->prev();
        m->destroy();
        m = prev;
      }
      continue;
    }
    n->output()->replaceAllUsesWith(out);
    n->destroy();
  }
}

// A bf16 layer norm's constant bf16 weight and bias -> fp32 copies: oneDNN 3.12 forms no partition
// of a bf16 LayerNorm with bf16 gamma/beta (its kernels take them in fp32), and PyTorch's own
// kernel computes the same either way (it widens them to fp32 itself; widening is exact).
void widen_bf16_layer_norm_params(torch::jit::Block* block) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) widen_bf16_layer_norm_params(b);
    if (!n->matches("aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
                    "float eps=1.0000000000000001e-05, bool cudnn_enable=True) -> Tensor"))
      continue;
    auto x = n->input(0)->type()->cast<torch::jit::TensorType>();
    if (!x || x->scalarType() != at::kBFloat16) continue;
    // Both or neither: PyTorch's kernel takes weight and bias of one dtype.
    auto bf16_constant = [&](size_t i) -> std::optional<at::Tensor> {
      auto c = n->input(i)->node()->kind() == c10::prim::Constant ? torch::jit::toIValue(n->input(i)) : std::nullopt;
      if (!c || !c->isTensor() || c->toTensor().scalar_type() != at::kBFloat16) return std::nullopt;
      return c->toTensor();
    };
    auto weight = bf16_constant(2), bias = bf16_constant(3);
    if (!weight || !bias) continue;
    torch::jit::WithInsertPoint at(n);
    n->replaceInput(2, block->owningGraph()->insertConstant(weight->to(at::kFloat)));
    n->replaceInput(3, block->owningGraph()->insertConstant(bias->to(at::kFloat)));
  }
}

}  // namespace

void DecomposeOps(std::shared_ptr<Graph>& g) {
  decompose_self_attention(g->block());
  {
    torch::jit::AliasDb db(g);
    decompose_sdpa(g->block(), db);
  }

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
  if (quirks::enabled("bf16_layer_norm_fp32_params")) widen_bf16_layer_norm_params(g->block());
  fill_missing_types(g->block());
  GRAPH_DUMP("After DecomposeOps", g);
}

}  // namespace llga
