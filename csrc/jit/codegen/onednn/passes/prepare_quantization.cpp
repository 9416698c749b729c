// Quantized models as FX's reference flow makes them hold quantize -> dequantize pairs around fp32
// ops. oneDNN fuses dequantize -> conv/matmul/pool -> post-ops -> quantize into int8 kernels; for
// that:
// - A Dequantize op needs its scale and zero point as attributes, but aten::dequantize reads them
//   off the tensor at run time. Where the input comes from a quantize_per_tensor with constant
//   parameters, they are recorded on the dequantize node (it may end up in a group without it).
// - oneDNN's patterns take a dequantize that feeds one op: a dequantize read by several ops (the
//   residual input of a ResNet block feeds a conv and an add) is cloned, one per use.
// - A residual add: with the x86/fbgemm configs the reference model requantizes the conv's output
//   before the add (conv -> quantize -> dequantize -> add(dequantize(identity)) -> relu ->
//   quantize). By default that requantization is kept (the conv's int8 kernel quantizes its
//   output) and the add is PyTorch's int8 add (fold_int8_adds): the results are the reference's.
//   TORCH_LLGA_INT8_EXACT=0 trades that for speed: the conv's output goes to the add directly, so
//   the add joins the conv's int8 kernel as a post-op (what FX's onednn backend config, which fuses
//   conv-add-relu, specifies). The add's input then differs from the reference's by at most half a
//   step of the dropped scale (ResNet-18: 2-3 output steps off the reference, 0 exact).
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <variant>

#include "jit/codegen/onednn/kernels/requantize.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

namespace {

using torch::jit::TensorType;

bool keep_every_requantization() {
  const char* env = std::getenv("TORCH_LLGA_INT8_EXACT");
  return !(env && std::strcmp(env, "0") == 0);
}

bool is_dequantize(const Value* v) { return onednn_kind(v->node()) == op::kind::Dequantize; }

// add(dequantize(quantize(conv(dequantize(x), dequantize(w)))), dequantize(y)) where oneDNN would take
// the add as a post-op of the int8 conv/linear: the quantized conv output is read by that add only.
// Returns the add's operand to bypass (the dequantize), or nullptr.
Value* requantized_conv_operand(Node* add) {
  if (onednn_kind(add) != op::kind::Add || !map_node(add)) return nullptr;
  for (size_t i = 0; i < 2; ++i) {
    Value* d = add->input(i);
    if (!is_dequantize(d) || !is_dequantize(add->input(1 - i)) || d->uses().size() != 1) continue;
    Node* q = d->node()->input(0)->node();
    if (!quantize_params(q) || q->output()->uses().size() != 1) continue;
    Node* conv = q->input(0)->node();
    if (!in_family(conv, kContraction) || !map_node(conv)) continue;
    if (!is_dequantize(conv->input(0)) || !is_dequantize(conv->input(1)) || conv->output()->uses().size() != 1) continue;
    if (quirks::int8_sum_of_own_input(add->input(1 - i), conv)) continue;
    return d;
  }
  return nullptr;
}

void elide_requantization(torch::jit::Block* block) {
  for (auto it = block->nodes().begin(); it != block->nodes().end(); ++it) {
    for (auto* b : it->blocks()) elide_requantization(b);
    Value* d = requantized_conv_operand(*it);
    if (!d) continue;
    Node* dq = d->node();
    Node* q = dq->input(0)->node();
    it->replaceInputWith(d, q->input(0));
    dq->destroy();
    q->destroy();
  }
}

// The table's Clamp or ReLU (hardtanh, relu6, clamp, relu) quantize q reads, if nothing else reads it.
Node* clamp_read_only_by(const Node* q) {
  Node* n = q->input(0)->node();
  const OpEntry* e = find_entry(n);
  bool clamp = e && (e->kind == op::kind::Clamp || e->kind == op::kind::ReLU);
  return clamp && n->output()->uses().size() == 1 ? n : nullptr;
}

// quantize(clamp(dequantize(quantize(x, s, z)), lo, hi), s, z) -> quantize(clamp(x, lo, hi), s, z):
// an activation FX observes apart from its conv (MobileNetV2's ReLU6: hardtanh) is requantized to
// the same parameters on both sides. Quantizing is monotone, so with the same grid both forms give
// the same codes (a clamp bound between two grid points rounds as the values beyond it do); the
// clamp then joins the conv's int8 kernel as a post-op instead of running as dequantize, clamp,
// quantize in PyTorch (MobileNetV2: 35 of them).
bool fold_requantized_clamps(torch::jit::Block* block) {
  bool folded_any = false;
  for (Node* q2 : block->nodes()) {
    for (auto* b : q2->blocks()) folded_any |= fold_requantized_clamps(b);
    auto p2 = quantize_params(q2);
    Node* clamp = p2 ? clamp_read_only_by(q2) : nullptr;
    if (!clamp || !is_dequantize(clamp->input(0))) continue;
    Node* q1 = clamp->input(0)->node()->input(0)->node();
    auto p1 = quantize_params(q1);
    auto dtype = [](const Node* q) { return q->output()->type()->expect<TensorType>()->scalarType(); };
    if (!p1 || p1->scale != p2->scale || p1->zero_point != p2->zero_point || !dtype(q1) || dtype(q1) != dtype(q2)) continue;
    Value* x = q1->input(0);
    clamp->replaceInput(0, x);
    clamp->output()->setType(x->type());
    folded_any = true;  // the dequantize and q1 go with dead code elimination if nothing else reads them
  }
  return folded_any;
}

// quantize(clamp(x)) where the quantize's grid ends at or inside the clamp's bounds: a ReLU before
// a zero point at the grid's bottom, a ReLU6 before a grid of [0, 6] (what an observer of its output
// gives). Quantizing is monotone, so a value beyond a bound gets the grid's end with the clamp or
// without: the clamp goes, and with it a post-op of the int8 kernel (the same codes; in-process
// A/B on an Intel Xeon with AVX-512: MobileNetV2 int8 1.09x faster, its ReLU6s' clip_v2 post-ops
// gone; ResNet-50's ReLUs cost nothing measurable).
bool drop_clamps_the_grid_makes(torch::jit::Block* block) {
  bool dropped_any = false;
  for (Node* q : block->nodes()) {
    for (auto* b : q->blocks()) dropped_any |= drop_clamps_the_grid_makes(b);
    auto p = quantize_params(q);
    Node* clamp = p ? clamp_read_only_by(q) : nullptr;
    auto spec = clamp ? map_node(clamp) : std::nullopt;  // its bounds, as the table reads them
    if (!spec) continue;
    auto dtype = q->output()->type()->expect<TensorType>()->scalarType();
    if (dtype != c10::kQUInt8 && dtype != c10::kQInt8) continue;
    constexpr float inf = std::numeric_limits<float>::infinity();
    float lo = 0, hi = inf;  // ReLU's
    for (auto& [name, value] : spec->attrs) {
      if (name == op::attr::min) lo = std::get<float>(value);
      if (name == op::attr::max) hi = std::get<float>(value);
    }
    const double qmin = dtype == c10::kQUInt8 ? 0 : -128, qmax = dtype == c10::kQUInt8 ? 255 : 127;
    // A bound's code before rounding, past the grid's end by more than float error could move it.
    auto code = [&](float v) { return static_cast<double>(v) / p->scale + p->zero_point; };
    bool low = lo == -inf || code(lo) <= qmin + 0.25;
    bool high = hi == inf || code(hi) >= qmax - 0.25;
    if (!low || !high) continue;
    q->replaceInput(0, clamp->input(0));
    clamp->destroy();  // now, not at dead code elimination: fold_int8_adds counts the add's readers
    dropped_any = true;
  }
  return dropped_any;
}

// quantize(relu?(add(dequantize(a), dequantize(b)))) that stays quantized at the add (the default
// exact mode, or an add oneDNN cannot take as a conv's post-op): oneDNN has no int8 add partition (3.12
// neither), so the five ops would run in PyTorch as fp32 passes over the activation. PyTorch's own
// int8 add does the same arithmetic in one pass: quantized::add(_relu)(a, b, scale, zero point).
const c10::Symbol kQuantizedAdd = c10::Symbol::fromQualString("quantized::add");
const c10::Symbol kQuantizedAddRelu = c10::Symbol::fromQualString("quantized::add_relu");

bool fold_int8_adds(torch::jit::Block* block) {
  bool folded_any = false;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* q = *it++;
    for (auto* b : q->blocks()) folded_any |= fold_int8_adds(b);
    auto params = quantize_params(q);
    if (!params || q->output()->type()->expect<TensorType>()->scalarType() != c10::kQUInt8) continue;
    Node* relu = q->input(0)->node();
    bool with_relu = onednn_kind(relu) == op::kind::ReLU;
    Node* add = with_relu ? relu->input(0)->node() : relu;
    if (onednn_kind(add) != op::kind::Add || add->inputs().size() != 3 || add->output()->uses().size() != 1 ||
        (with_relu && relu->output()->uses().size() != 1))
      continue;
    auto alpha = torch::jit::constant_as<int64_t>(add->input(2));
    if (!alpha || *alpha != 1 || !is_dequantize(add->input(0)) || !is_dequantize(add->input(1))) continue;
    Value* a = add->input(0)->node()->input(0);
    Value* b = add->input(1)->node()->input(0);
    auto ta = a->type()->cast<TensorType>(), tb = b->type()->cast<TensorType>();
    if (!ta || !tb || ta->scalarType() != c10::kQUInt8 || tb->scalarType() != c10::kQUInt8 || !ta->sizes().concrete_sizes() ||
        ta->sizes().concrete_sizes() != tb->sizes().concrete_sizes())
      continue;
    Graph* g = block->owningGraph();
    torch::jit::WithInsertPoint point(q);
    Value* folded = g->insert(with_relu ? kQuantizedAddRelu : kQuantizedAdd, {a, b, params->scale, params->zero_point});
    folded->setType(q->output()->type());
    q->output()->replaceAllUsesWith(folded);
    q->destroy();
    if (with_relu) relu->destroy();
    add->destroy();  // its dequantizes go with dead code elimination if nothing else reads them
    folded_any = true;
  }
  return folded_any;
}

bool is_quantized_reshape(const Node* n) {
  auto t = onednn_kind(n) == op::kind::StaticReshape ? n->input(0)->type()->cast<TensorType>() : nullptr;
  return t && t->scalarType() && c10::isQIntType(*t->scalarType());
}

// The scale and zero point of a quantized tensor made by quantize_per_tensor, fold_int8_adds or
// llga::requantize, or a reshape of one (fold_requantized_reshapes).
std::optional<QuantParams> output_params(const Node* n) {
  if (is_quantized_reshape(n)) return output_params(n->input(0)->node());
  if (n->kind() == kQuantizedAddRelu || n->kind() == kQuantizedAdd || n->kind() == kRequantize) {
    const size_t first = n->kind() == kRequantize ? 1 : 2;  // (x, scale, zero point, ..) or (a, b, scale, zero point)
    auto scale = torch::jit::constant_as<double>(n->input(first));
    auto zp = torch::jit::constant_as<int64_t>(n->input(first + 1));
    if (scale && zp) return QuantParams{*scale, *zp};
    return std::nullopt;
  }
  return quantize_params(n);
}

// quantize(reshape(dequantize(q)), s, z) where q holds codes of the same grid (s, z and dtype):
// reshape(q). A classifier's flatten between its pool and its linear, which PT2E's graph dequantizes
// and quantizes again, otherwise three PyTorch ops between two int8 groups. Exact: a code c
// dequantizes to (c - z) * s, which divided by s is c - z within a few ulps, and rounds back to it.
// On another grid (a dropout between flatten and linear, which PT2E observes apart:
// MobileNetV2's): llga::requantize(reshape(q), s, z), the same codes as the three ops, in one pass.
bool fold_requantized_reshapes(torch::jit::Block* block) {
  bool folded_any = false;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* q2 = *it++;
    for (auto* b : q2->blocks()) folded_any |= fold_requantized_reshapes(b);
    auto p2 = quantize_params(q2);
    Node* reshape = p2 ? q2->input(0)->node() : nullptr;
    if (!reshape || onednn_kind(reshape) != op::kind::StaticReshape || reshape->output()->uses().size() != 1 ||
        !is_dequantize(reshape->input(0)))
      continue;
    Value* codes = reshape->input(0)->node()->input(0);
    auto p1 = output_params(codes->node());
    auto t1 = codes->type()->cast<TensorType>();
    auto t2 = q2->output()->type()->cast<TensorType>();
    if (!t1 || !t2 || !t1->scalarType() || !c10::isQIntType(*t1->scalarType()) || !t2->scalarType()) continue;
    bool same_grid = p1 && p1->scale == p2->scale && p1->zero_point == p2->zero_point && p2->scale >= 1e-30 &&
                     t1->scalarType() == t2->scalarType();
    // Requantized only from codes of a known per-tensor grid (the type cannot tell a per-channel
    // tensor, whose reshape PyTorch's dequantize would refuse).
    if (!same_grid && !(p1 && runtime::own_kernels_enabled() && !runtime::switched_off("requantize") && (*t1->scalarType() == at::kQUInt8 || *t1->scalarType() == at::kQInt8)))
      continue;
    reshape->replaceInput(0, codes);
    reshape->output()->setType(t2->withScalarType(t1->scalarType()));
    if (same_grid) {
      q2->output()->replaceAllUsesWith(reshape->output());
      q2->destroy();  // the dequantize goes with dead code elimination if nothing else reads it
    } else {
      // The parameters as numbers (FX's reference flow passes them as tensors).
      torch::jit::WithInsertPoint at(q2);
      Graph* g = block->owningGraph();
      replace_with(q2, kRequantize, {reshape->output(), g->insertConstant(p2->scale), g->insertConstant(p2->zero_point), q2->input(3)});
    }
    folded_any = true;
  }
  return folded_any;
}

// The highest value v can hold, where the graph says: a clamp's top, a dequantize of codes whose top
// is recorded, and what pools, views and ReLU keep within their input's bounds (and 0: pools pad).
// As a float, the way PyTorch and oneDNN compute dequantized values: rounding is monotone, so no
// value of v lies above it.
std::optional<float> highest_value(const Value* v) {
  const Node* n = v->node();
  const op::kind kind = onednn_kind(n);
  if (kind == op::kind::Clamp) {
    auto spec = map_node(n);
    if (!spec) return std::nullopt;
    for (const auto& [name, value] : spec->attrs)
      if (name == op::attr::max) return std::get<float>(value);
    return std::nullopt;
  }
  if (kind == op::kind::Dequantize) {
    if (!n->hasAttribute(kQuantMaxCode)) return std::nullopt;
    double scale = static_cast<float>(n->f(kQuantScale));
    return static_cast<float>(static_cast<double>(n->i(kQuantMaxCode) - n->i(kQuantZeroPoint)) * scale);
  }
  if (kind != op::kind::ReLU && !in_family(n, kPooling | kView)) return std::nullopt;
  auto top = highest_value(n->input(0));
  if (!top) return std::nullopt;
  return std::max(*top, 0.0f);
}

// The largest u8 code quantize node q (or an llga::requantize) can give, where its input's highest
// value is known below code 255 (PT2E's reduce_range arrives as a clamp at code 127 and a quantize:
// torch_llga/_pt2e.py; a pool of codes below 128 keeps them there). Rounded up at halves, with a
// margin: an upper bound whichever way oneDNN or PyTorch rounds.
std::optional<int64_t> largest_u8_code(const Node* q, const QuantParams& p) {
  // A reshape of codes on one grid (a classifier's flatten of its pool's codes) keeps their largest.
  while (is_quantized_reshape(q)) q = q->input(0)->node();
  if (q->output()->type()->expect<TensorType>()->scalarType() != c10::kQUInt8) return std::nullopt;
  std::optional<float> top;
  if (q->kind() == c10::aten::quantize_per_tensor) {
    top = highest_value(q->input(0));
  } else if (q->kind() == kRequantize) {  // its codes' largest, dequantized (through the reshapes)
    const Node* codes = q->input(0)->node();
    while (is_quantized_reshape(codes)) codes = codes->input(0)->node();
    auto from = output_params(codes);
    auto code = from ? largest_u8_code(codes, *from) : std::nullopt;
    if (code) top = static_cast<float>(static_cast<double>(*code - from->zero_point) * static_cast<float>(from->scale));
  }
  if (!top) return std::nullopt;
  float steps = *top * (1.0f / static_cast<float>(p.scale));
  if (!(steps + static_cast<float>(p.zero_point) < 254.0f)) return std::nullopt;  // also NaN
  return std::max<int64_t>(0, static_cast<int64_t>(std::floor(steps + 0.501f)) + p.zero_point);
}

void record_params_and_split(torch::jit::Block* block) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) record_params_and_split(b);
    if (onednn_kind(n) != op::kind::Dequantize || n->inputs().size() != 1 || !is_tensor(n->input(0))) continue;
    if (auto q = output_params(n->input(0)->node())) {
      n->f_(kQuantScale, q->scale);
      n->i_(kQuantZeroPoint, q->zero_point);
      if (auto top = largest_u8_code(n->input(0)->node(), *q)) n->i_(kQuantMaxCode, *top);
    }
    auto uses = n->output()->uses();
    for (size_t i = 1; i < uses.size(); ++i) {
      Node* copy = block->owningGraph()->createClone(n, [](Value* v) { return v; });
      copy->insertBefore(uses[i].user);
      copy->output()->copyMetadata(n->output());
      uses[i].user->replaceInput(uses[i].offset, copy->output());
    }
  }
}

// dequantize(constant int8 weight) that oneDNN does not take as an int8 weight (no VNNI:
// quirks::int8_without_vnni; zero points; per-channel along another axis): the conv or matmul runs
// in fp32. Left in the graph, PyTorch would dequantize the whole weight on every call (ResNet-18:
// 11M values); folded here once into an fp32 constant, the weight is oneDNN's cached constant.
// A weight several ops read (its dequantize copied per use) is folded once: `folded` maps each
// int8 constant to its fp32 one, made at the graph's top, where it precedes every use.
bool fold_fp32_weights(torch::jit::Block* block, std::unordered_map<Value*, Value*>& folded) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) fold_fp32_weights(b, folded);
    if (onednn_kind(n) != op::kind::Dequantize || n->inputs().size() != 1 || map_node(n)) continue;
    auto w = torch::jit::toIValue(n->input(0));
    if (!w || !w->isTensor() || !w->toTensor().is_quantized()) continue;
    Value*& fp32 = folded[n->input(0)];
    if (!fp32) {
      Graph* g = block->owningGraph();
      torch::jit::WithInsertPoint point(g->block()->nodes().front());
      at::Tensor weight = w->toTensor().dequantize();
      fp32 = g->insertConstant(weight);
      fp32->setType(TensorType::create(weight));
    }
    n->output()->replaceAllUsesWith(fp32);  // the dequantize and the int8 constant go with dead code elimination
  }
  return !folded.empty();
}

}  // namespace

void PrepareQuantization(std::shared_ptr<Graph>& g) {
  if (!keep_every_requantization()) elide_requantization(g->block());
  bool folded = fold_requantized_clamps(g->block());
  folded |= drop_clamps_the_grid_makes(g->block());
  folded |= fold_int8_adds(g->block());
  if (fold_requantized_reshapes(g->block()) || folded) torch::jit::EliminateDeadCode(g);
  record_params_and_split(g->block());
  // after the recording: whether a weight stays int8 can depend on its src's codes (int8_without_vnni)
  std::unordered_map<Value*, Value*> fp32_weights;
  if (fold_fp32_weights(g->block(), fp32_weights)) torch::jit::EliminateDeadCode(g);
  GRAPH_DUMP("After PrepareQuantization", g);
}

}  // namespace llga
