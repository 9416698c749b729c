#pragma once
// The torch_llga pass pipeline, one pass per file, run in this order by pipeline.cpp on every graph
// the profiling executor optimizes (as a pre-pass, while profiled types are on the values).
#include <torch/csrc/jit/ir/ir.h>

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

// Node kinds of our own (outside PyTorch's namespaces, so not INTERNAL_SPECIAL_CASE).
inline const c10::Symbol kFusionGroup = c10::Symbol::fromQualString("llga::FusionGroup");
inline const c10::Symbol kGuard = c10::Symbol::fromQualString("llga::Guard");
// Attributes of a fusion group node.
// Per output (PropagateLayout): kOpaqueOutputs's values.
inline const c10::Symbol kOpaqueOutputs = c10::Symbol::attr("opaque_outputs");
constexpr int64_t kStridedOutput = 0;       // PyTorch reads it: eager's strides
constexpr int64_t kOpaqueOutput = 1;        // only groups read it: oneDNN's layout (often blocked)
constexpr int64_t kChannelsLastOutput = 2;  // groups and stride-free PyTorch ops: NHWC strides
// Attribute of a group: per input, 1 when it is a guard's output. The interpreter then holds
// exactly one more reference to it while the group runs (a register, dropped after the guard's
// If), which the kernel counts before it computes an output in that input's memory.
inline const c10::Symbol kGuardedInputs = c10::Symbol::attr("guarded_inputs");
// Attribute of a group: a process-unique id that survives graph copies (the executor runs a copy),
// so torch_llga.release(module) finds the kernels of a module's groups.
inline const c10::Symbol kGroupId = c10::Symbol::attr("group_id");
// Attribute of an op the fuser left to PyTorch: why (torch_llga.explain() reads it).
inline const c10::Symbol kUnfusedReason = c10::Symbol::attr("llga_unfused");
// Attribute of a node the fuser mapped for the profiled sizes only (a reshape to them, say): its
// group cannot be compiled for other sizes (recorded where the mapping is decided: FuseGraph).
// kAllSizes, or kSpatialSizes: for its input's dims 2.. only (another batch size is any new size).
inline const c10::Symbol kShapeSpecific = c10::Symbol::attr("llga_shape_specific");
inline constexpr int64_t kAllSizes = 1, kSpatialSizes = 2;
// Attribute of a guard: its group may be compiled for other input sizes of the same ranks
// (kAnySizes), for other sizes of the inputs' dim 0 only (kOtherBatchSizes), or not (0).
inline const c10::Symbol kShapeFree = c10::Symbol::attr("shape_free");
inline constexpr int64_t kAnySizes = 1, kOtherBatchSizes = 2;
// On a guard: its group's inputs must hold no NaN/Inf (scanned at run time); see kKeepsNaN.
inline const c10::Symbol kFiniteInputs = c10::Symbol::attr("finite_inputs");
// On a guard: per checked input, -1 (scan it, unless it is an LLGA tensor: a group that scanned its
// own inputs made it), k: its finiteness is the guard's k-th extra (bool) input, an llga::AllFinite
// shared by the guards of every group that reads the same value, kNotScanned: no NaN/Inf can
// reach it (rows of a constant table that holds none) or its infinities are meant (an
// llga::attention_bias), or kScanLlgaToo: scan it even as an LLGA tensor (a group that carries
// NaN/Inf through, a conv or linear without an activation, made it from inputs nobody scanned).
inline const c10::Symbol kFiniteGiven = c10::Symbol::attr("finite_given");
constexpr int64_t kNotScanned = -2;
constexpr int64_t kScanLlgaToo = -3;
// attention_bias(mask, like): 0 where the boolean mask attends, -inf where not, in like's dtype (decompose_ops.cpp's
// SDPA adds it to the scores). Its -inf are its meaning, and it holds no NaN: guards do not scan it.
inline const c10::Symbol kAttentionBias = c10::Symbol::fromQualString("llga::attention_bias");
// On a guard: its inputs must be plain strided tensors, no LLGA ones (a small-graph plan reads them).
inline const c10::Symbol kPlainInputs = c10::Symbol::attr("plain_inputs");
inline const c10::Symbol kAllFinite = c10::Symbol::fromQualString("llga::AllFinite");
// For a fallback's PyTorch ops (a failed guard's, a kernel's own): t as eager would have it. A 4-D
// tensor a group handed over in channels-last strides (kChannelsLastOutput) where the profile saw
// NCHW is made NCHW again: PyTorch's ops pass the layout on, and a later view() expects eager's.
at::Tensor in_profiled_layout(const at::Tensor& t, const c10::TensorType& profiled);

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

// The whole pipeline (no-op while torch_llga is disabled).
void RunPipeline(std::shared_ptr<Graph>& g);

}  // namespace llga
