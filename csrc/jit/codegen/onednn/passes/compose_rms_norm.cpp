// ComposeRmsNorm: RMSNorm written out in aten ops (Hugging Face's LlamaRMSNorm and its kin:
// x * rsqrt(mean(x^2, -1, keepdim) + eps) * weight, in fp32, cast back) -> aten::rms_norm, which
// the op table maps to oneDNN's RMSNorm: one op instead of seven, none of which oneDNN fuses alone
// (mean and rsqrt have no mapping).
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include "jit/codegen/onednn/passes/passes.h"

#include <string>
#include <utility>

namespace llga {

namespace {

using torch::jit::Match;
using torch::jit::SubgraphRewriter;

// The IR of RMSNorm written out, and of its composed form (the same inputs): Llama writes a cast to
// fp32 first (the tracer records none for an fp32 x) and one back to x's dtype before the weight.
// normalized_shape is [-1] in the composed form (the pattern's dims); ComposeRmsNorm writes the
// last size in.
std::pair<std::string, std::string> rms_norm_patterns(bool cast_in, bool cast_back) {
  std::string inputs = std::string("%x, ") + (cast_in ? "%f32, %nb, %cp, %mf, " : "") +
                       (cast_back ? "%back, %nb2, %cp2, %mf2, " : "") + "%two, %dims, %keep, %dtype, %eps, %alpha, %w";
  std::string h = cast_in ? "%h" : "%x";
  std::string n = cast_back ? "%c" : "%n";
  std::string written = "graph(" + inputs + "):\n" +
                        (cast_in ? "  %h = aten::to(%x, %f32, %nb, %cp, %mf)\n" : "") +
                        "  %p = aten::pow(" + h + ", %two)\n"
                        "  %v = aten::mean(%p, %dims, %keep, %dtype)\n"
                        "  %a = aten::add(%v, %eps, %alpha)\n"
                        "  %r = aten::rsqrt(%a)\n"
                        "  %n = aten::mul(" + h + ", %r)\n" +
                        (cast_back ? "  %c = aten::to(%n, %back, %nb2, %cp2, %mf2)\n" : "") +
                        "  %o = aten::mul(%w, " + n + ")\n  return (%o)";
  std::string composed = "graph(" + inputs + "):\n  %o = aten::rms_norm(%x, %dims, %w, %eps)\n  return (%o)";
  return {written, composed};
}

bool is_number(const std::optional<c10::IValue>& v, double want) {
  return v && (v->isInt() || v->isDouble()) && v->toScalar().toDouble() == want;
}

// The match is RMSNorm over the last dimension of a float/bf16 x, its weight a 1-D constant of x's
// dtype and last size, and the casts (if any) to fp32 and back to x's dtype.
bool is_rms_norm(const Match& m, const std::unordered_map<std::string, Value*>& vmap) {
  auto x = m.values_map.at(vmap.at("x"))->type()->cast<torch::jit::TensorType>();
  auto w = m.values_map.at(vmap.at("w"));
  auto wt = w->type()->cast<torch::jit::TensorType>();
  if (!x || !wt || !x->scalarType() || !wt->scalarType() || *x->scalarType() != *wt->scalarType()) return false;
  if (*x->scalarType() != c10::kFloat && *x->scalarType() != c10::kBFloat16) return false;
  auto sizes = x->sizes().concrete_sizes();
  auto wsizes = wt->sizes().concrete_sizes();
  if (!sizes || sizes->empty() || !wsizes || wsizes->size() != 1 || wsizes->back() != sizes->back()) return false;
  auto dims = matched_constant(m, vmap, "dims"), keep = matched_constant(m, vmap, "keep");
  auto dtype = matched_constant(m, vmap, "dtype");
  auto eps = matched_constant(m, vmap, "eps");
  if (!is_number(matched_constant(m, vmap, "two"), 2) || !is_number(matched_constant(m, vmap, "alpha"), 1)) return false;
  if (!dims || !dims->isIntList() || dims->toIntVector() != std::vector<int64_t>{-1}) return false;
  if (!keep || !keep->isBool() || !keep->toBool() || !dtype || !dtype->isNone()) return false;
  if (!eps || !(eps->isDouble() || eps->isInt())) return false;
  // The casts, where the pattern has them: to fp32, back to x's dtype, plain (no copy, no layout).
  auto f32 = matched_constant(m, vmap, "f32"), back = matched_constant(m, vmap, "back");
  if (vmap.count("f32") && (!f32 || !f32->isInt() || f32->toInt() != static_cast<int64_t>(c10::kFloat))) return false;
  if (vmap.count("back") && (!back || !back->isInt() || back->toInt() != static_cast<int64_t>(*x->scalarType()))) return false;
  if (!vmap.count("f32") && *x->scalarType() != c10::kFloat) return false;  // statistics in fp32 as written
  for (const char* name : {"nb", "cp", "nb2", "cp2"}) {
    auto b = matched_constant(m, vmap, name);
    if (vmap.count(name) && (!b || !b->isBool() || b->toBool())) return false;
  }
  for (const char* name : {"mf", "mf2"}) {
    auto f = matched_constant(m, vmap, name);
    if (vmap.count(name) && (!f || !f->isNone())) return false;
  }
  return true;
}

// The composed node's normalized_shape: [-1] (the pattern's dims) -> [the last size].
void write_normalized_shapes(torch::jit::Block* b) {
  for (Node* n : b->nodes()) {
    for (torch::jit::Block* sub : n->blocks()) write_normalized_shapes(sub);
    if (n->kind() != c10::Symbol::fromQualString("aten::rms_norm")) continue;
    auto shape = torch::jit::toIValue(n->input(1));
    auto x = n->input(0)->type()->cast<torch::jit::TensorType>();
    auto sizes = x ? x->sizes().concrete_sizes() : std::nullopt;
    if (!shape || !shape->isIntList() || shape->toIntVector() != std::vector<int64_t>{-1} || !sizes) continue;
    torch::jit::WithInsertPoint guard(n);
    n->replaceInput(1, n->owningGraph()->insertConstant(c10::IValue(std::vector<int64_t>{sizes->back()})));
  }
}

}  // namespace

void ComposeRmsNorm(std::shared_ptr<Graph>& g) {
  for (auto [cast_in, cast_back] : {std::pair{true, true}, std::pair{false, true}, std::pair{false, false}}) {
    auto [written, composed] = rms_norm_patterns(cast_in, cast_back);
    SubgraphRewriter rewriter;
    rewriter.RegisterRewritePattern(written, composed);
    rewriter.runOnGraph(g, is_rms_norm);
  }
  write_normalized_shapes(g->block());
  GRAPH_DUMP("After ComposeRmsNorm", g);
}

}  // namespace llga
