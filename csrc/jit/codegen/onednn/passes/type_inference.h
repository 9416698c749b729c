#pragma once
// Rewrites (SubgraphRewriter patterns, new nodes) create values with plain `Tensor` types; the
// op table needs complete profiled-style types. This fills them in for the few ops our rewrites
// create, from their inputs' types.
#include <torch/csrc/jit/ir/ir.h>

namespace llga {

// Gives every tensor output in the block (recursively) that lacks sizes a complete type when it can
// be derived: elementwise unary ops copy their input's type, binary ops broadcast, mm is [m, n].
void fill_missing_types(torch::jit::Block* block);

// v's complete type, or the one its producer's inputs give it (the same rules, one level), or null.
torch::jit::TensorTypePtr complete_or_inferred_type(const torch::jit::Value* v);

}  // namespace llga
