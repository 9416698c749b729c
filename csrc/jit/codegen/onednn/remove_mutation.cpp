#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/remove_mutation.h>

#include "jit/codegen/onednn/op_table.h"
#include "jit/codegen/onednn/passes.h"
#include "jit/codegen/onednn/type_inference.h"

namespace llga {

// Traced graphs hold in-place forms (aten::relu_, aten::add_): make the ones we can map functional
// so they can join a partition. Other mutation is left alone (and blocks fusion of what it touches).
void RemoveMutation(std::shared_ptr<Graph>& g) {
  torch::jit::RemoveListMutation(g);
  torch::jit::RemoveTensorMutation(g, [](torch::jit::Node* n) {
    std::string name = n->kind().toQualString();
    if (name.empty() || name.back() != '_') return false;
    auto functional = c10::Symbol::fromQualString(name.substr(0, name.size() - 1));
    return table_has_kind(functional) || functional == c10::aten::silu || functional == c10::aten::addmm;
  });
  fill_missing_types(g->block());  // the functional nodes' outputs are new, untyped values
  GRAPH_DUMP("After RemoveMutation", g);
}

}  // namespace llga
