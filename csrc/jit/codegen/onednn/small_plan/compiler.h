#pragma once
// The small-graph plan's compiler: a llga::SmallPlan node's subgraph into a SmallProgram
// (program.h), once per node. One class over several files: the driver (compile(), the dtype and
// limits, the values' layouts, output and scratch places, fail/why) and the switch from the op
// table's PlanStep to a handler in compiler.cpp; the handlers by family in compile_elementwise.cpp,
// compile_layouts.cpp and compile_matmul.cpp.
#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/small_plan/program.h"

namespace llga {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::TensorType;
using torch::jit::Value;

class Compiler {
 public:
  Compiler(const Graph& g, SmallProgram& p) : g_(g), p_(p) {}

  bool compile();

  const std::string& why() const { return why_; }

  using Handler = std::function<bool(Compiler&, const Node*)>;

  // The handler of n's step (the op table's plan_step for its schema), if any.
  static std::optional<Handler> find_handler(const Node* n);

 private:

  bool fail(std::string reason) {
    why_ = std::move(reason);
    return false;
  }

  const char* dtype_name() const { return p_.bf16 ? "bf16" : "fp32"; }

  // compiler.cpp: profiled sizes, operands and constant arguments, output and scratch places.
  std::optional<std::vector<int64_t>> profiled_sizes(const Value* v) const;
  const Layout* operand(const Value* v);
  static std::optional<double> number(const Value* v);
  static std::optional<int64_t> int_arg(const Value* v);
  static std::optional<int64_t> wrap_dim(std::optional<int64_t> d, int64_t rank);
  static std::optional<std::vector<int64_t>> int_list(const Value* v);
  Layout new_output(const std::vector<int64_t>& sizes, const Value* v);
  Layout produce(const Value* v, const std::vector<int64_t>& sizes);
  Layout scratch_layout(const std::vector<int64_t>& sizes);
  bool within_limits(const Node* n, const std::vector<int64_t>& sizes);
  static std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

  // compile_elementwise.cpp
  void elementwise_step(Fn fn, const Layout& out, std::vector<const Layout*> in, float alpha = 1, float lo = 0, float hi = 0);
  bool unary_op(const Node* n, Fn fn, float alpha = 1, float lo = 0, float hi = 0);
  bool binary_op(const Node* n, Fn fn, float alpha = 1);
  bool binary_alpha(const Node* n, Fn fn);
  bool clamp(const Node* n);
  bool relu6(const Node* n);
  bool leaky_relu(const Node* n);
  bool elu(const Node* n);
  bool gelu(const Node* n);
  bool into_cat_slice(const Node* list, const Value* v, const Layout& slice);

  // compile_layouts.cpp
  bool view(const Node* n, std::vector<int64_t> sizes, std::vector<int64_t> strides);
  std::optional<Layout> dense(const Node* n);
  bool reshape(const Node* n);
  bool permuted(const Node* n, const std::vector<int64_t>& order);
  bool permute(const Node* n);
  bool transpose(const Node* n);
  bool t(const Node* n);
  bool unsqueeze(const Node* n);
  bool squeeze(const Node* n);
  bool identity(const Node* n);
  bool contiguous(const Node* n);
  bool cat(const Node* n);
  bool dropout(const Node* n);

  // compile_matmul.cpp
  bool matmul_op(const Node* n, const Layout& a, const Layout& b, const Layout* bias);
  bool matmul(const Node* n);
  bool linear(const Node* n);
  bool addmm(const Node* n);

  // compiler.cpp: the handler of each PlanStep.
  static Handler unary_step(Fn fn);
  static Handler binary_step(Fn fn);
  static Handler binary_alpha_step(Fn fn);
  static Handler by(bool (Compiler::*method)(const Node*));
  static Handler handler(PlanStep step);

  const Graph& g_;
  SmallProgram& p_;
  std::unordered_map<const Value*, Layout> layouts_;
  std::unordered_set<const Value*> wanted_;  // the subgraph's outputs
  std::vector<const Value*> owner_;          // per output buffer, the value computed into it
  // Per value an elementwise step computed: that step's index, and how to emit it again writing
  // another layout (cat places such values straight into their slice: into_cat_slice).
  std::unordered_map<const Value*, std::pair<size_t, std::function<void(const Layout&)>>> remakes_;
  std::unordered_set<size_t> dropped_steps_;  // steps emitted again elsewhere
  at::ScalarType dtype_ = at::kFloat;
  int64_t scratch_ = 0, macs_ = 0, rows_ = 0;
  std::string why_;
};

}  // namespace llga
