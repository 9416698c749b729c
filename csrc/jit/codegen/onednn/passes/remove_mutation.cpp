#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/remove_mutation.h>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/passes/type_inference.h"

namespace llga {

namespace {
// The functional form promotes dtypes (a bf16 tensor + an fp32 tensor is fp32); the in-place one
// keeps self's (found by fuzzing). Only operands of self's dtype, or scalars, or 0-dim tensors of
// self's kind (floating or not: they do not promote; a traced x.add_(0.5) holds a 0-dim double)
// are safe to rewrite. (Self may be the output of an op rewritten just before, not typed yet: its
// type is inferred.)
bool keeps_dtype(const torch::jit::Node* n) {
  bool tensor_operands = false;
  for (size_t i = 1; i < n->inputs().size(); ++i) tensor_operands |= is_tensor(n->input(i));
  if (!tensor_operands) return true;
  auto self = complete_or_inferred_type(n->input(0));
  if (!self) return false;
  for (size_t i = 1; i < n->inputs().size(); ++i) {
    auto t = n->input(i)->type()->cast<torch::jit::TensorType>();
    if (!t || t->scalarType() == self->scalarType()) continue;
    bool same_kind_0dim = self->scalarType() && self->dim() && *self->dim() > 0 &&  // (0-dim with 0-dim promotes)
                          t->dim() && *t->dim() == 0 && t->scalarType() &&
                          c10::isFloatingType(*t->scalarType()) == c10::isFloatingType(*self->scalarType()) &&
                          !c10::isComplexType(*t->scalarType()) && *t->scalarType() != c10::ScalarType::Bool &&
                          *self->scalarType() != c10::ScalarType::Bool;
    if (!same_kind_0dim) return false;
  }
  return true;
}
}  // namespace

// Traced graphs hold in-place forms (aten::relu_, aten::add_): make the ones we can map functional
// so they can join a partition. Other mutation is left alone (and blocks fusion of what it touches).
void RemoveMutation(std::shared_ptr<Graph>& g) {
  torch::jit::RemoveListMutation(g);
  torch::jit::RemoveTensorMutation(g, [](torch::jit::Node* n) {
    std::string name = n->kind().toQualString();
    if (name.empty() || name.back() != '_') return false;
    auto functional = c10::Symbol::fromQualString(name.substr(0, name.size() - 1));
    return functional_form_fuses(functional) && keeps_dtype(n);
  });
  fill_missing_types(g->block());  // the functional nodes' outputs are new, untyped values
  GRAPH_DUMP("After RemoveMutation", g);
}

}  // namespace llga
