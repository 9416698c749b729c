#pragma once
// The IR's own node kinds and attributes: what the passes write into a graph and the runtime reads
// back (its own header, so that runtime/ includes no pass header).
#include <ATen/core/interned_strings.h>
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

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
// Attribute of a node the fuser mapped for the profiled sizes only (a reshape to them, say): at
// other sizes its group's partition is mapped again (FusionKernel::maps_at; recorded where the
// mapping is decided: FuseGraph). kAllSizes, or kSpatialSizes: for its input's dims 2.. only
// (another batch size keeps the partition for any sizes).
inline const c10::Symbol kShapeSpecific = c10::Symbol::attr("llga_shape_specific");
inline constexpr int64_t kAllSizes = 1, kSpatialSizes = 2;
// Attribute of a guard: its group may be compiled for other input sizes of the same ranks
// (kAnySizes), or not (0: a small plan).
inline const c10::Symbol kShapeFree = c10::Symbol::attr("shape_free");
inline constexpr int64_t kAnySizes = 1;
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
// A group fused against a measured speed rule runs in one of two forms (passes/speed_choices.cpp):
//   %fused = llga::SpeedChoice[choice_id=k, rules="..."](the group's tensor inputs)
//   prim::If(%fused): block 0 the group, block 1 its ops fused with the rule applied; each block
//   ends with llga::SpeedChoiceEnd[choice_id=k]() (the timing's end).
inline const c10::Symbol kSpeedChoice = c10::Symbol::fromQualString("llga::SpeedChoice");
inline const c10::Symbol kSpeedChoiceEnd = c10::Symbol::fromQualString("llga::SpeedChoiceEnd");
inline const c10::Symbol kChoiceId = c10::Symbol::attr("choice_id");  // process-unique, apart from group ids
inline const c10::Symbol kSpeedRules = c10::Symbol::attr("speed_rules");  // the rules' names, ", "-separated
// On an op a measured speed rule would have kept out of its group: the rule's name (FuseGraph).
inline const c10::Symbol kSpeedRule = c10::Symbol::attr("llga_speed_rule");
}  // namespace llga
