#include "jit/codegen/onednn/passes/type_inference.h"

#include <ATen/ExpandUtils.h>
#include <c10/util/strides.h>

#include "jit/codegen/onednn/mapping/op_table.h"

namespace llga {

using torch::jit::TensorType;
using torch::jit::TensorTypePtr;

namespace {

TensorTypePtr complete(const Value* v) {
  auto t = v->type()->cast<TensorType>();
  return t && t->isComplete() ? t : nullptr;
}

TensorTypePtr contiguous_type(const TensorTypePtr& like, const std::vector<int64_t>& sizes) {
  return TensorType::create(*like->scalarType(), *like->device(), c10::IntArrayRef(sizes),
                            c10::IntArrayRef(c10::contiguous_strides(sizes)), false);
}

TensorTypePtr infer(const Node* n) {
  const OpEntry* e = find_entry(n);
  if (kind_flags(n->kind()) & (kAdditive | kMultiplicative)) {  // arithmetic binary, any overload
    auto a = complete(n->input(0));
    if (!a) return nullptr;
    if (!is_tensor(n->input(1))) return a;  // Tensor op Scalar keeps the tensor's type
    auto b = complete(n->input(1));
    if (!b || a->scalarType() != b->scalarType()) return nullptr;
    auto sizes = at::infer_size(*a->sizes().concrete_sizes(), *b->sizes().concrete_sizes());
    return contiguous_type(a, sizes);
  }
  if (e && (e->flags & kMatrixProduct2d)) {
    auto a = complete(n->input(0)), b = complete(n->input(1));
    if (!a || !b) return nullptr;
    return contiguous_type(a, {a->sizes().concrete_sizes()->at(0), b->sizes().concrete_sizes()->at(1)});
  }
  if (e && (e->flags & kShapePreserving) && !(e->flags & kCastsDtype)) return complete(n->input(0));
  return nullptr;
}

}  // namespace

TensorTypePtr complete_or_inferred_type(const Value* v) {
  if (auto t = complete(v)) return t;
  return v->node()->outputs().size() == 1 ? infer(v->node()) : nullptr;
}

void fill_missing_types(torch::jit::Block* block) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) fill_missing_types(b);
    if (n->outputs().size() != 1 || !is_tensor(n->output()) || complete(n->output())) continue;
    if (auto t = infer(n)) n->output()->setType(t);
  }
}

}  // namespace llga
