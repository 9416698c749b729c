#pragma once
// The small-graph plan: a whole graph of tiny fp32 or bf16 tensors (DeepAndWide, ranking heads) run as one
// native step, llga::SmallPlan, instead of one interpreter instruction and one ATen dispatch per op.
// On such graphs the arithmetic is a few hundred nanoseconds and the framework around it is the
// rest: TorchScript spends ~1 us a node, ATen ~0.6 us an op even when called from C++ (measured on
// DeepAndWide: 6.6 us of direct at:: calls for 1 us of work). The plan is compiled once per node:
// every value gets a fixed layout (sizes and strides, known from the profile: the guard in front
// admits inputs of the profiled sizes only, and the plan makes them dense), intermediates a fixed
// place in one scratch area, and a call is a flat loop over the steps.
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <string>

namespace llga {

inline const c10::Symbol kSmallPlan = c10::Symbol::fromQualString("llga::SmallPlan");

// The limits of "small": past them oneDNN's kernels beat the plan's loops. Measured on two linear
// layers with a relu (rows x in x out, twice), plan against oneDNN groups, AMD EPYC Zen 5, 2 threads
// (matmuls from 32K multiply-adds split their columns over both). The plan's dot products read the
// weights once per row, oneDNN's kernels once per call:
// - one row (matrix-vector work): 2.33x at 1x128x128, 1.79x at 1x256x256, 1.22x at 1x512x512;
// - four rows: 1.32x at 4x128x128, 0.75x at 4x256x256;
// - sixteen rows: 0.83x at 16x64x64.
constexpr int64_t kSmallPlanMaxElements = 16 * 1024;     // per computed tensor
constexpr int64_t kSmallPlanMaxMacs = 64 * 1024;         // multiply-adds of all matmuls together,
constexpr int64_t kSmallPlanMaxMatVecRows = 4;           // ... unless no matmul has more rows than this,
constexpr int64_t kSmallPlanMaxMatVecMacs = 160 * 1024;  // then up to these,
constexpr int64_t kSmallPlanMaxVecMacs = 640 * 1024;     // or these when every matmul has one row (MLP at batch 1)
// bf16 graphs: the plan computes in fp32 from fp32 copies of the weights, oneDNN with bf16 dot
// products over half the bytes, so one-row work crosses over sooner. Measured the same way (bf16,
// AMD EPYC Zen 4, 2 threads): 1.96x at 1x128x128, 1.38x at 1x256x256, 1.00x at 1x384x384, 0.89x at
// 1x512x512; 1.16x at 4x128x128; 1.04x at 16x64x64 (under the limit already).
constexpr int64_t kSmallPlanMaxVecMacsBf16 = 256 * 1024;

constexpr int64_t small_plan_max_macs(int64_t rows, bool bf16) {
  return rows <= 1 ? (bf16 ? kSmallPlanMaxVecMacsBf16 : kSmallPlanMaxVecMacs)
                   : rows <= kSmallPlanMaxMatVecRows ? kSmallPlanMaxMatVecMacs : kSmallPlanMaxMacs;
}

struct SmallProgram;

// Whether the plan has a step (or a layout) for n's op.
bool small_plan_has_step(const torch::jit::Node* n);

// Compiles the program of a llga::SmallPlan node's subgraph (whose values carry complete profiled
// types) and keeps it for the node's operator, so a plan is compiled once. False, with the reason
// in `why` (an op the plan has no step for, a dtype, a size over the limits, ...), if it has none.
bool compile_small_plan(torch::jit::Node* plan, std::string* why);

}  // namespace llga
