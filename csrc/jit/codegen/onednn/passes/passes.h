#pragma once
// The torch_llga pass pipeline, one pass per file, run in this order by pipeline.cpp on every graph
// the profiling executor optimizes (as a pre-pass, while profiled types are on the values).
#include <torch/csrc/jit/ir/ir.h>

#include "jit/codegen/onednn/mapping/llga_nodes.h"

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch::jit {
struct Match;  // a SubgraphRewriter match (torch/csrc/jit/ir/subgraph_matcher.h)
}

namespace llga {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// n replaced by a node of `kind` reading `inputs`, where n was, its one output typed as n's and
// read wherever n's was (the passes that hand an op to torch_llga's own kernels); returns it.
inline Node* replace_with(Node* n, c10::Symbol kind, at::ArrayRef<Value*> inputs) {
  Node* own = n->owningGraph()->create(kind, inputs);
  own->insertBefore(n);
  own->output()->setType(n->output()->type());
  n->output()->replaceAllUsesWith(own->output());
  n->destroy();
  return own;
}

// The constant a SubgraphRewriter pattern's input `name` matched (vmap names the pattern's values;
// the match maps them); nullopt if it matched no constant or the pattern has no such input.
std::optional<c10::IValue> matched_constant(const torch::jit::Match& match,
                                            const std::unordered_map<std::string, Value*>& vmap, const char* name);

// The passes, in the pipeline's order (pipeline() lists them with their names and switches).
void RemoveMutation(std::shared_ptr<Graph>& g);    // in-place forms of mapped ops -> functional
void ComposeRmsNorm(std::shared_ptr<Graph>& g);    // RMSNorm written out (pow, mean, rsqrt, mul) -> aten::rms_norm
void SplitChunkedLinears(std::shared_ptr<Graph>& g);  // a biased linear's output chunked on its last dim -> a linear per chunk
void OwnKernelsEarly(std::shared_ptr<Graph>& g);   // own-kernel table rows of phase kEarly (own_kernels.cpp)
void DecomposeOps(std::shared_ptr<Graph>& g);      // silu, addmm, MHA fast path, SDPA -> mapped ops; bf16 LN weights -> fp32
void MergeParallelLinears(std::shared_ptr<Graph>& g);  // bias-free or int8 linears of one input -> one linear, sliced
void PrepareBinary(std::shared_ptr<Graph>& g);     // scalar operands -> tensors; alpha; x+0, x*1
void PrepareQuantization(std::shared_ptr<Graph>& g);  // dequantize: scale/zero point recorded; one per use; requantized reshapes
void DeferSizeCheck(std::shared_ptr<Graph>& g);    // aten::size reads move before shape-preserving ops
void PlanSmallGraph(std::shared_ptr<Graph>& g);    // a graph of tiny tensors -> one llga::SmallPlan
void OwnKernelsBeforeFuser(std::shared_ptr<Graph>& g);  // own-kernel table rows of phase kBeforeFuser
void FuseGraph(std::shared_ptr<Graph>& g);         // oneDNN partitions -> llga::FusionGroup nodes
void SpeedChoices(std::shared_ptr<Graph>& g);      // a group a measured speed rule would split -> both forms, timed
void PropagateLayout(std::shared_ptr<Graph>& g);   // group-to-group outputs may stay opaque
void InsertGuards(std::shared_ptr<Graph>& g);      // profiled-type checks with unfused fallback
void InPlaceActivations(std::shared_ptr<Graph>& g);  // a PyTorch GELU or clamp of a group's fresh output (or a view of it) -> in place
void OwnKernelsAfterGuards(std::shared_ptr<Graph>& g);  // own-kernel table rows of phase kAfterGuards

// The own-kernel rewrites: each applies rows of the own-kernel table (own_kernels.cpp), which
// runs them in its phases.
void DecodeAttention(std::shared_ptr<Graph>& g);   // SDPA of a decoder's step over a KV cache -> llga::decode_attention
void RowLinears(std::shared_ptr<Graph>& g);        // linears of 1-4 rows over large fp32/bf16 weights -> llga::row_linear
void Int8LinearsAsConvolutions(std::shared_ptr<Graph>& g);  // int8 linears of 1-16 rows, no VNNI -> 1x1 int8 convolutions
void WidenBf16Linears(std::shared_ptr<Graph>& g);  // other bf16 linears, no oneDNN bf16 kernels -> llga::widened_linear
void LayerNormOwnKernel(std::shared_ptr<Graph>& g);  // layer norms whose output a quantize reads -> llga::layer_norm
void QuantizedPoolOwnKernel(std::shared_ptr<Graph>& g);  // int8 global average pools -> llga::quantized_global_avg_pool
void QuantizeOwnKernel(std::shared_ptr<Graph>& g);  // PyTorch's quantizes of large fp32 tensors -> llga::quantize_per_tensor

// One pass of the pipeline: its name (the `_jit_pass_<name>` export for IR tests, the switch that
// turns it off: TORCH_LLGA_PASSES_OFF), the function and what it does.
struct PassEntry {
  const char* name;
  void (*run)(std::shared_ptr<Graph>&);
  const char* what;
  bool required;  // the pipeline's output is wrong without it: cannot be switched off
};
const std::vector<PassEntry>& pipeline();

// Where an own-kernel row applies.
enum class OwnPhase { kEarly, kBeforeFuser, kAfterGuards, kInsidePass };
// One own kernel: what it takes and where it runs it; the pass of its phase applies it (in the
// table's order), unless switched off by name (TORCH_LLGA_PASSES_OFF) or own kernels are off.
struct OwnKernelRow {
  const char* name;     // the switch's name ("row_linear")
  const char* kernel;   // the op the graph gets ("llga::row_linear", or what runs instead)
  const char* takes;    // the ops and shapes it takes
  const char* dtypes;
  const char* cpu;      // the CPU features it needs
  const char* choice;   // the choice site that measures it against PyTorch's op (choices.h), or "" (a rule)
  OwnPhase phase;
  void (*apply)(std::shared_ptr<Graph>&);  // null: applied by another row's rewrite or by the pass named in `takes`
};
const std::vector<OwnKernelRow>& own_kernel_table();

// The fuser on one block of a fused graph (a speed choice's rule form: speed_choices.cpp).
void FuseBlock(torch::jit::Block* block);
// Whether FuseGraph lets the measured speed rules hold back (their groups then get two forms): the
// speed_choices pass is on and the speed_rule choice is not pinned to its default.
bool speed_rules_measured();

// The whole pipeline (no-op while torch_llga is disabled).
void RunPipeline(std::shared_ptr<Graph>& g);

}  // namespace llga
