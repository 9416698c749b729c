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

const std::vector<PassEntry>& pipeline() {
  static const std::vector<PassEntry> passes = {
      {"remove_mutation", RemoveMutation, "in-place forms of mapped ops -> functional", true},
      {"compose_rms_norm", ComposeRmsNorm, "RMSNorm written out (pow, mean, rsqrt, mul) -> aten::rms_norm", false},
      {"split_chunked_linears", SplitChunkedLinears, "a biased linear's output chunked on its last dim -> a linear per chunk", false},
      {"own_kernels_early", OwnKernelsEarly, "own-kernel rows of the early phase (decode attention)", false},
      {"decompose_ops", DecomposeOps, "silu, addmm, MHA fast path, SDPA -> mapped ops; bf16 LN weights -> fp32", false},
      {"merge_parallel_linears", MergeParallelLinears, "bias-free or int8 linears of one input -> one linear, sliced", false},
      {"prepare_binary", PrepareBinary, "scalar operands -> tensors; alpha; x+0, x*1", true},
      {"prepare_quantization", PrepareQuantization, "dequantize: scale/zero point recorded; one per use; requantized reshapes", true},
      {"defer_size_check", DeferSizeCheck, "aten::size reads move before shape-preserving ops", false},
      {"plan_small_graph", PlanSmallGraph, "a graph of tiny tensors -> one llga::SmallPlan", false},
      {"own_kernels_before_fuser", OwnKernelsBeforeFuser, "own-kernel rows before the fuser (row linears, widened, ...)", false},
      {"fuse_graph", FuseGraph, "oneDNN partitions -> llga::FusionGroup nodes", false},
      {"speed_choices", SpeedChoices, "a group a measured speed rule would split -> both forms, the faster timed", false},
      {"propagate_layout", PropagateLayout, "group-to-group outputs may stay opaque", false},
      {"insert_guards", InsertGuards, "profiled-type checks with unfused fallback", true},
      {"in_place_activations", InPlaceActivations, "a PyTorch GELU or clamp of a group's fresh output -> in place", false},
      {"own_kernels_after_guards", OwnKernelsAfterGuards, "own-kernel rows after the guards (quantize)", false},
  };
  return passes;
}

void RunPipeline(std::shared_ptr<Graph>& g) {
  if (!runtime::fusing() || !torch::jit::getProfilingMode()) return;
  GRAPH_DUMP("Before torch_llga", g);
  // Profile nodes become types on the values; the guards re-check them at run time.
  torch::jit::RemoveProfileNodesAndSpecializeTypes(g);
  for (const PassEntry& pass : pipeline()) {
    if (!pass.required && runtime::switched_off(pass.name)) {
      GRAPH_DEBUG("Pass ", pass.name, " switched off");
      continue;
    }
    pass.run(g);
  }
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
