// The small-graph plan's compiler: the driver (compile(): dtype, limits, outputs, the staging
// area), the values' operands, output and scratch places, and the switch from the op table's
// PlanStep to a handler (the handlers: compile_elementwise.cpp, compile_layouts.cpp,
// compile_matmul.cpp).
#include <ATen/ATen.h>
#include <torch/csrc/jit/ir/constants.h>

#include "jit/codegen/onednn/small_plan/compiler.h"
#include "jit/codegen/onednn/small_plan/small_plan.h"

namespace llga {

bool Compiler::compile() {
  // One dtype for the whole graph, its first input's (fp32 or bf16): graphs mixing dtypes (which
  // eager would promote) get no plan.
  for (const Value* v : g_.inputs())
    if (auto t = v->type()->cast<TensorType>(); t && t->scalarType()) {
      dtype_ = *t->scalarType();
      break;
    }
  if (dtype_ != at::kFloat && dtype_ != at::kBFloat16) return fail("a graph of neither fp32 nor bf16 tensors");
  p_.bf16 = dtype_ == at::kBFloat16;
  for (const Value* v : g_.inputs()) {
    auto sizes = profiled_sizes(v);
    if (!sizes) return fail("input " + v->debugName() + " is not a " + dtype_name() + " tensor of known sizes");
    Layout l{{kInput, static_cast<int>(p_.inputs++), 0}, *sizes, contiguous_strides(*sizes)};  // made dense by run_plan
    layouts_[v] = l;
  }
  for (const Value* v : g_.outputs()) wanted_.insert(v);
  for (const Node* n : g_.nodes()) {
    if (n->kind() == c10::prim::Constant || n->kind() == c10::prim::ListConstruct) continue;
    auto handle = find_handler(n);
    if (!handle) return fail(std::string(n->kind().toQualString()) + " has no step in the small-graph plan");
    if (!(*handle)(*this, n)) return false;
    for (const Value* v : n->outputs()) {
      auto sizes = profiled_sizes(v);
      if (!sizes || !layouts_.count(v) || layouts_.at(v).sizes != *sizes)
        return fail(std::string(n->kind().toQualString()) + "'s output differs from its profile");
    }
  }
  const int64_t max_macs = small_plan_max_macs(rows_, p_.bf16);
  if (macs_ > max_macs) return fail("more than " + std::to_string(max_macs) + " multiply-adds");
  std::unordered_map<const Value*, int> output_of;
  for (const Value* v : g_.outputs()) {
    if (!layouts_.count(v)) return fail("an output is no tensor the plan computes");
    auto done = output_of.find(v);
    if (done != output_of.end()) {
      p_.outputs.push_back(done->second);
      continue;
    }
    Layout l = layouts_.at(v);
    // Eager returns a view of an input (or of another output) as a view, which a caller may
    // write through: such graphs stay with the interpreter.
    if (l.ref.space == kInput || (l.ref.space == kOutput && owner_.at(l.ref.index) != v))
      return fail("an output is a view of an input or of another output");
    if (l.ref.space != kOutput) {  // a view of an intermediate or a constant: copied out
      Layout copy = new_output(l.sizes, v);
      elementwise_step(Fn::kCopy, copy, {&l});
      l = copy;
    }
    output_of[v] = l.ref.index;
    p_.outputs.push_back(l.ref.index);
  }
  p_.scratch_floats = scratch_;
  if (!dropped_steps_.empty()) {
    std::vector<Step> kept;
    for (size_t i = 0; i < p_.steps.size(); ++i)
      if (!dropped_steps_.count(i)) kept.push_back(p_.steps[i]);
    p_.steps = std::move(kept);
  }
  if (p_.bf16) {  // the staging area: inputs, then outputs
    for (size_t i = 0; i < p_.inputs; ++i) {
      p_.input_numel.push_back(layouts_.at(g_.inputs()[i]).numel());
      p_.input_at.push_back(p_.staged_floats);
      p_.staged_floats += padded(p_.input_numel.back());
    }
    for (const auto& sizes : p_.output_sizes) {
      p_.output_at.push_back(p_.staged_floats);
      p_.staged_floats += padded(c10::multiply_integers(sizes));
    }
  }
  for (const at::Tensor& t : p_.constants) p_.constant_data.push_back(const_cast<float*>(t.const_data_ptr<float>()));
  return true;
}

std::optional<Compiler::Handler> Compiler::find_handler(const Node* n) {
  const OpEntry* e = find_entry(n);
  if (!e || e->plan_step == PlanStep::kNone) return std::nullopt;
  return handler(e->plan_step);
}

std::optional<std::vector<int64_t>> Compiler::profiled_sizes(const Value* v) const {
  auto t = v->type()->cast<TensorType>();
  if (!t || t->scalarType() != dtype_ || !t->device() || !t->device()->is_cpu()) return std::nullopt;
  auto sizes = t->sizes().concrete_sizes();
  if (!sizes || sizes->size() > static_cast<size_t>(kMaxDims)) return std::nullopt;
  return sizes;
}

// A tensor operand: its layout (a constant tensor is held by the program). The pointer stays
// valid while more layouts are added (an unordered_map does not move its elements).
const Layout* Compiler::operand(const Value* v) {
  if (auto it = layouts_.find(v); it != layouts_.end()) return &it->second;
  auto c = torch::jit::toIValue(v);
  if (!c) return nullptr;
  at::Tensor t;
  if (c->isTensor()) {
    t = c->toTensor();
    if (t.scalar_type() != dtype_ || !t.device().is_cpu() || t.layout() != c10::kStrided || t.is_neg() || t.is_conj() ||
        t.dim() > kMaxDims)
      return nullptr;
    if (p_.bf16) t = t.contiguous().to(at::kFloat);  // exact; the steps read fp32
  } else if (c->isDouble() || c->isInt()) {  // a Scalar operand
    t = at::scalar_tensor(c->toScalar(), at::kFloat);
  } else {
    return nullptr;
  }
  p_.constants.push_back(t);
  Layout l{{kConstant, static_cast<int>(p_.constants.size() - 1), 0}, t.sizes().vec(), t.strides().vec()};
  return &(layouts_[v] = l);
}

std::optional<double> Compiler::number(const Value* v) {
  auto c = torch::jit::toIValue(v);
  if (!c || !(c->isDouble() || c->isInt())) return std::nullopt;
  return c->toScalar().toDouble();
}

std::optional<int64_t> Compiler::int_arg(const Value* v) {
  auto c = torch::jit::toIValue(v);
  if (!c || !c->isInt()) return std::nullopt;
  return c->toInt();
}

// d as a dim of `rank` dims (negative counts from the end), if it is one.
std::optional<int64_t> Compiler::wrap_dim(std::optional<int64_t> d, int64_t rank) {
  if (!d || *d < -rank || *d >= rank) return std::nullopt;
  return *d < 0 ? *d + rank : *d;
}

std::optional<std::vector<int64_t>> Compiler::int_list(const Value* v) {
  auto c = torch::jit::toIValue(v);
  if (!c || !c->isIntList()) return std::nullopt;
  return c->toIntVector();
}

Layout Compiler::new_output(const std::vector<int64_t>& sizes, const Value* v) {
  p_.output_sizes.push_back(sizes);
  owner_.push_back(v);
  return Layout{{kOutput, static_cast<int>(p_.output_sizes.size() - 1), 0}, sizes, contiguous_strides(sizes)};
}

// The layout of a computed value: its own output tensor if the subgraph returns it, else a place
// in the scratch area (places 16 floats apart: loads use memcpy, no alignment is assumed).
Layout Compiler::produce(const Value* v, const std::vector<int64_t>& sizes) {
  return layouts_[v] = wanted_.count(v) ? new_output(sizes, v) : scratch_layout(sizes);
}

Layout Compiler::scratch_layout(const std::vector<int64_t>& sizes) {
  Layout l{{kScratch, 0, scratch_}, sizes, contiguous_strides(sizes)};
  scratch_ += padded(l.numel());
  return l;
}

bool Compiler::within_limits(const Node* n, const std::vector<int64_t>& sizes) {
  if (c10::multiply_integers(sizes) > kSmallPlanMaxElements)
    return fail(std::string(n->kind().toQualString()) + " computes more than " + std::to_string(kSmallPlanMaxElements) + " elements");
  return true;
}

std::optional<std::vector<int64_t>> Compiler::broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

// Table handlers: an elementwise op of one Fn, or a member function of the compiler.
Compiler::Handler Compiler::unary_step(Fn fn) { return [fn](Compiler& c, const Node* n) { return c.unary_op(n, fn); }; }

Compiler::Handler Compiler::binary_step(Fn fn) { return [fn](Compiler& c, const Node* n) { return c.binary_op(n, fn); }; }

Compiler::Handler Compiler::binary_alpha_step(Fn fn) { return [fn](Compiler& c, const Node* n) { return c.binary_alpha(n, fn); }; }

Compiler::Handler Compiler::by(bool (Compiler::*method)(const Node*)) {
  return [method](Compiler& c, const Node* n) { return (c.*method)(n); };
}

// What computes each step the op table names (op_table.cpp gives each schema its PlanStep).
Compiler::Handler Compiler::handler(PlanStep step) {
  switch (step) {
    case PlanStep::kAdd: return binary_alpha_step(Fn::kAdd);
    case PlanStep::kSub: return binary_alpha_step(Fn::kSub);
    case PlanStep::kMul: return binary_step(Fn::kMul);
    case PlanStep::kDiv: return binary_step(Fn::kDiv);
    case PlanStep::kMaximum: return binary_step(Fn::kMaximum);
    case PlanStep::kMinimum: return binary_step(Fn::kMinimum);
    case PlanStep::kRelu: return unary_step(Fn::kRelu);
    case PlanStep::kAbs: return unary_step(Fn::kAbs);
    case PlanStep::kSquare: return unary_step(Fn::kSquare);
    case PlanStep::kSqrt: return unary_step(Fn::kSqrt);
    case PlanStep::kLog: return unary_step(Fn::kLog);
    case PlanStep::kHardSigmoid: return unary_step(Fn::kHardSigmoid);
    case PlanStep::kHardSwish: return unary_step(Fn::kHardSwish);
    case PlanStep::kSilu: return unary_step(Fn::kSilu);
    case PlanStep::kSigmoid: return unary_step(Fn::kSigmoid);
    case PlanStep::kTanh: return unary_step(Fn::kTanh);
    case PlanStep::kExp: return unary_step(Fn::kExp);
    case PlanStep::kNeg: return unary_step(Fn::kNeg);
    case PlanStep::kRelu6: return by(&Compiler::relu6);
    case PlanStep::kGelu: return by(&Compiler::gelu);
    case PlanStep::kElu: return by(&Compiler::elu);
    case PlanStep::kClamp: return by(&Compiler::clamp);
    case PlanStep::kLeakyRelu: return by(&Compiler::leaky_relu);
    case PlanStep::kTranspose: return by(&Compiler::transpose);
    case PlanStep::kT: return by(&Compiler::t);
    case PlanStep::kPermute: return by(&Compiler::permute);
    case PlanStep::kUnsqueeze: return by(&Compiler::unsqueeze);
    case PlanStep::kSqueeze: return by(&Compiler::squeeze);
    case PlanStep::kReshape: return by(&Compiler::reshape);
    case PlanStep::kContiguous: return by(&Compiler::contiguous);
    case PlanStep::kDropout: return by(&Compiler::dropout);
    case PlanStep::kCat: return by(&Compiler::cat);
    case PlanStep::kMatmul: return by(&Compiler::matmul);
    case PlanStep::kLinear: return by(&Compiler::linear);
    case PlanStep::kAddmm: return by(&Compiler::addmm);
    case PlanStep::kNone: break;
  }
  return nullptr;
}

}  // namespace llga
