// Registers the pipeline with the profiling executor as a pre-pass: it sees each graph on its
// second call, after profiling, with the profiled shapes still on the values.
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/passes/pass_manager.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/profiling_record.h>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/settings/settings.h"

namespace llga {

void RunPipeline(std::shared_ptr<Graph>& g) {
  if (!runtime::fusing() || !torch::jit::getProfilingMode()) return;
  GRAPH_DUMP("Before torch_llga", g);
  // Profile nodes become types on the values; the guards re-check them at run time.
  torch::jit::RemoveProfileNodesAndSpecializeTypes(g);
  RemoveMutation(g);
  ComposeRmsNorm(g);
  SplitChunkedLinears(g);
  DecodeAttention(g);
  DecomposeOps(g);
  MergeParallelLinears(g);
  PrepareBinary(g);
  PrepareQuantization(g);
  DeferSizeCheck(g);
  PlanSmallGraph(g);
  RowLinears(g);
  Int8RowLinears(g);
  WidenBf16Linears(g);
  LayerNormOwnKernel(g);
  QuantizedPoolOwnKernel(g);
  FuseGraph(g);
  PropagateLayout(g);
  InsertGuards(g);
  InPlaceActivations(g);
  QuantizeOwnKernel(g);
  // What the guards checked must not leak into later passes as facts.
  torch::jit::RemoveTensorTypeSpecializations(g);
  GRAPH_DUMP("After torch_llga", g);
}

namespace {
const auto registered = torch::jit::registerPrePass([](std::shared_ptr<Graph>& g) { RunPipeline(g); });

// The executor profiles the tensors TensorExpr ops read and write. Every op the table maps is
// profiled too (quantize_per_tensor, dequantize and max_pool3d are no TensorExpr ops: they would
// reach us without sizes or dtype), scaled_dot_product_attention and nn.MultiheadAttention's
// fast path, which DecomposeOps spells out only for profiled inputs (an attention reading the
// graph's input has no other profiled reader), and the ops small-graph plans have steps for.
const bool profiled_table_ops = [] {
  torch::jit::RegisterProfilingNode([](const Node* n) {
    const OpEntry* e = find_entry(n);
    return n->kind() == c10::aten::scaled_dot_product_attention || n->kind() == c10::aten::_native_multi_head_attention ||
           (e && (e->maps_to_onednn() || e->plan_step != PlanStep::kNone));
  });
  return true;
}();
}  // namespace

}  // namespace llga
