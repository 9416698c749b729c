// The small-graph plan's elementwise steps: the loop nest of an op over broadcast operands, the
// unary and binary ops and those with arguments (alpha, clamp bounds, slopes, gelu's
// approximation), and cat's remakes of a step into its slice (into_cat_slice).
#include <torch/csrc/jit/ir/constants.h>

#include <array>
#include <cmath>

#include "jit/codegen/onednn/small_plan/compiler.h"

namespace llga {

// Adds an elementwise step writing `out` from the operands (each broadcast to out's sizes).
void Compiler::elementwise_step(Fn fn, const Layout& out, std::vector<const Layout*> in, float alpha, float lo, float hi) {
  Step s;
  s.fn = fn;
  s.round_bf16 = p_.bf16 && fn != Fn::kCopy;  // a copy moves values that are bf16 already
  s.alpha = alpha, s.lo = lo, s.hi = hi;
  s.out = out.ref;
  s.a = in[0]->ref;
  s.b = in.size() > 1 ? in[1]->ref : in[0]->ref;
  const size_t rank = out.sizes.size();
  std::vector<std::array<int64_t, 3>> dims;  // per dim: the three operands' strides
  std::vector<int64_t> sizes;
  for (size_t d = 0; d < rank; ++d) {
    std::array<int64_t, 3> st{out.strides[d], 0, 0};
    for (size_t k = 0; k < 2; ++k) {
      const Layout& l = *in[std::min(k, in.size() - 1)];
      int64_t ld = static_cast<int64_t>(d) - static_cast<int64_t>(rank - l.sizes.size());
      st[k + 1] = (ld < 0 || l.sizes[ld] == 1) ? 0 : l.strides[ld];
    }
    if (out.sizes[d] == 1) continue;  // walks nothing
    // Merged with the dim before when every operand steps over it as one (outer = inner * size).
    if (!dims.empty() && dims.back()[0] == st[0] * out.sizes[d] && dims.back()[1] == st[1] * out.sizes[d] &&
        dims.back()[2] == st[2] * out.sizes[d]) {
      sizes.back() *= out.sizes[d];
      dims.back() = st;
      continue;
    }
    sizes.push_back(out.sizes[d]);
    dims.push_back(st);
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    dims.push_back({1, 1, 1});
  }
  s.nest.dims = static_cast<int>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    s.nest.sizes[d] = sizes[d];
    for (int k = 0; k < 3; ++k) s.nest.strides[k][d] = dims[d][k];
  }
  p_.steps.push_back(s);
}

bool Compiler::unary_op(const Node* n, Fn fn, float alpha, float lo, float hi) {
  const Layout* x = operand(n->input(0));
  if (!x) return fail("an operand of " + std::string(n->kind().toQualString()) + " is no float tensor");
  if (!within_limits(n, x->sizes)) return false;
  auto emit = [this, fn, in = *x, alpha, lo, hi](const Layout& out) { elementwise_step(fn, out, {&in}, alpha, lo, hi); };
  remakes_[n->output()] = {p_.steps.size(), emit};
  emit(produce(n->output(), x->sizes));
  return true;
}

bool Compiler::binary_op(const Node* n, Fn fn, float alpha) {
  const Layout* x = operand(n->input(0));
  const Layout* y = operand(n->input(1));
  if (!x || !y) return fail("an operand of " + std::string(n->kind().toQualString()) + " is no float tensor");
  auto sizes = broadcast(x->sizes, y->sizes);
  if (!sizes) return fail("operands that do not broadcast");
  if (!within_limits(n, *sizes)) return false;
  auto emit = [this, fn, a = *x, b = *y, alpha](const Layout& out) { elementwise_step(fn, out, {&a, &b}, alpha); };
  remakes_[n->output()] = {p_.steps.size(), emit};
  emit(produce(n->output(), *sizes));
  return true;
}

bool Compiler::binary_alpha(const Node* n, Fn fn) {
  auto alpha = n->inputs().size() > 2 ? number(n->input(2)) : std::optional<double>(1);
  if (!alpha) return fail("alpha is not a constant");
  return binary_op(n, fn, static_cast<float>(*alpha));
}

bool Compiler::clamp(const Node* n) {
  auto bound = [&](size_t i, float otherwise) -> std::optional<float> {
    if (i >= n->inputs().size() || n->input(i)->type()->kind() == c10::TypeKind::NoneType) return otherwise;
    auto v = number(n->input(i));
    if (!v || std::isnan(*v)) return std::nullopt;
    return static_cast<float>(*v);
  };
  auto lo = bound(1, -INFINITY), hi = bound(2, INFINITY);
  if (!lo || !hi) return fail("clamp bounds that are not constant numbers");
  return unary_op(n, Fn::kClamp, 1, *lo, *hi);
}

bool Compiler::relu6(const Node* n) { return unary_op(n, Fn::kClamp, 1, 0, 6); }

bool Compiler::leaky_relu(const Node* n) {
  auto slope = number(n->input(1));
  return slope ? unary_op(n, Fn::kLeakyRelu, static_cast<float>(*slope)) : fail("leaky_relu slope is not a constant");
}

bool Compiler::elu(const Node* n) {
  auto alpha = number(n->input(1)), scale = number(n->input(2)), input_scale = number(n->input(3));
  if (!alpha || scale != 1.0 || input_scale != 1.0) return fail("elu with a scale");
  return unary_op(n, Fn::kElu, static_cast<float>(*alpha));
}

bool Compiler::gelu(const Node* n) {
  auto mode = torch::jit::toIValue(n->input(1));
  if (mode && mode->isString() && mode->toStringRef() == "none") return unary_op(n, Fn::kGelu);
  if (mode && mode->isString() && mode->toStringRef() == "tanh") return unary_op(n, Fn::kGeluTanh);
  return fail("gelu of an unknown approximation");
}

// Moves the elementwise step that computed v to the end, writing v's slice of a cat's output
// instead of a place of its own (DeepAndWide's clamp, then a copy of its 3,200 floats), where
// nothing but this cat's list reads v (not a view, not the graph's return either: each is a use).
// The step's operands were all computed before it.
bool Compiler::into_cat_slice(const Node* list, const Value* v, const Layout& slice) {
  auto remake = remakes_.find(v);
  if (remake == remakes_.end() || v->uses().size() != 1 || list->output()->uses().size() != 1) return false;
  dropped_steps_.insert(remake->second.first);
  remake->second.second(slice);
  layouts_[v] = slice;
  return true;
}

}  // namespace llga
