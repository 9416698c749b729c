// Binary ops as oneDNN wants them: both operands tensors of the output's dtype, no alpha.
//   x + s, x * s (Scalar s)        -> x + tensor(s) of x's dtype   (alpha folded into s)
//   x + y * alpha (Tensor y)       -> x + (y * tensor(alpha))     (also where x is the broadcast one)
//   x op c (0-dim constant tensor) -> x op tensor(c) of x's dtype
//   x + 0, x - 0, x * 1, x / 1     -> x   (unless x or the result is written in place: the
//                                         result would alias x, and a write to one reach the other)
// Only where x is a profiled floating tensor of rank >= 1. The constants are 0-dim, so PyTorch
// treats them like the scalars they replace (type promotion, broadcasting, any device) when a
// guard sends other inputs to the unfused fallback; oneDNN sees them as [1]-shaped.
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>

#include <ATen/ATen.h>

#include <unordered_set>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"

namespace llga {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::TensorType;
using torch::jit::Value;

namespace {

// Arithmetic binary ops, any overload (the op table's kAdditive: add, sub; kMultiplicative: mul, div).
bool is_binary(const Node* n) { return kind_flags(n->kind()) & (kAdditive | kMultiplicative); }

bool has_alpha(const Node* n) { return kind_flags(n->kind()) & kAdditive; }

// A floating tensor whose type equals the node's output type: the op keeps its dtype and sizes.
bool keeps_type(const Value* x, const Node* n) {
  auto t = x->type()->cast<TensorType>();
  auto o = n->output()->type()->cast<TensorType>();
  return t && o && t->isComplete() && o->isComplete() && t->dim() && *t->dim() >= 1 &&
         c10::isFloatingType(*t->scalarType()) && *t == *o;
}

std::optional<double> number(const Value* v) {
  auto iv = torch::jit::toIValue(v);
  if (!iv || !(iv->isInt() || iv->isDouble())) return std::nullopt;
  return iv->toScalar().toDouble();
}

Value* tensor_constant(Node* before, double value, const Value* like) {
  auto dtype = *like->type()->expect<TensorType>()->scalarType();
  torch::jit::WithInsertPoint guard(before);
  return before->owningGraph()->insertConstant(at::scalar_tensor(value, at::TensorOptions().dtype(dtype)));
}

// The values some op writes to in place (or that alias such a value), before this pass.
using Written = std::unordered_set<const Value*>;

void collect_written(Block* block, torch::jit::AliasDb& db, Written& written) {
  for (const Value* v : block->inputs())
    if (db.hasWriters(v)) written.insert(v);
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) collect_written(b, db, written);
    for (const Value* v : n->outputs())
      if (db.hasWriters(v)) written.insert(v);
  }
}

// x + y * alpha -> x + (y * tensor(alpha)), for a tensor y of the output's floating dtype.
void split_alpha(Node* n, double alpha) {
  Value* y = n->input(1);
  auto t = y->type()->cast<TensorType>(), o = n->output()->type()->cast<TensorType>();
  if (!t || !o || !t->scalarType() || !c10::isFloatingType(*t->scalarType()) || t->scalarType() != o->scalarType()) return;
  torch::jit::WithInsertPoint guard(n);
  Value* scaled = n->owningGraph()->insert(c10::aten::mul, {y, tensor_constant(n, alpha, y)});
  scaled->setType(y->type());
  n->replaceInput(1, scaled);
  n->replaceInput(2, n->owningGraph()->insertConstant(1));
}

// Replaces n by `x kind c` with tensor c; returns the new node.
Node* replace_with_tensor_op(Node* n, Value* x, Value* c, Written& written) {
  torch::jit::WithInsertPoint guard(n);
  Value* r = n->owningGraph()->insert(n->kind(), {x, c});
  r->setType(n->output()->type());
  if (written.count(n->output())) written.insert(r);
  n->output()->replaceAllUsesWith(r);
  n->destroy();
  return r->node();
}

void prepare(Block* block, Written& written) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (auto* b : n->blocks()) prepare(b, written);
    if (!is_binary(n) || n->outputs().size() != 1) continue;
    Value* x = n->input(0);
    Value* y = n->input(1);
    double alpha = 1;
    if (has_alpha(n)) {
      auto a = n->inputs().size() > 2 ? number(n->input(2)) : std::optional<double>(1);
      if (!a) continue;
      alpha = *a;
    }
    if (!keeps_type(x, n)) {  // x is broadcast ([1, 1, 28, 28] + [1, 32, 28, 28]): only alpha moves
      auto t = x->type()->cast<TensorType>(), o = n->output()->type()->cast<TensorType>();
      if (alpha != 1 && t && o && t->scalarType() && t->scalarType() == o->scalarType()) split_alpha(n, alpha);
      continue;
    }

    if (auto s = number(y)) {  // Tensor op Scalar
      double v = *s * alpha;
      bool identity = (has_alpha(n) && v == 0) || (!has_alpha(n) && v == 1);
      if (identity && !written.count(x) && !written.count(n->output())) {
        n->output()->replaceAllUsesWith(x);
        n->destroy();
      } else {
        replace_with_tensor_op(n, x, tensor_constant(n, v, x), written);
      }
      continue;
    }
    if (!y->type()->cast<TensorType>()) continue;

    if (auto c = torch::jit::toIValue(y); c && c->isTensor() && c->toTensor().dim() == 0 &&
                                            c->toTensor().is_floating_point()) {  // 0-dim constant
      double v = c->toTensor().item<double>() * alpha;
      replace_with_tensor_op(n, x, tensor_constant(n, v, x), written);
      continue;
    }
    if (alpha != 1) split_alpha(n, alpha);
  }
}

}  // namespace

void PrepareBinary(std::shared_ptr<Graph>& g) {
  Written written;
  {
    torch::jit::AliasDb db(g);
    collect_written(g->block(), db, written);
  }
  prepare(g->block(), written);
  GRAPH_DUMP("After PrepareBinary", g);
}

}  // namespace llga
