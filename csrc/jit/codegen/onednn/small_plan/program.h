#pragma once
// A small-graph plan's program (see small_plan.h): what the compiler (compiler.h) makes of a
// llga::SmallPlan node's subgraph, once per node, and run_plan (run.cpp) runs on every call.
//
// Compile time (once per node): each value of the subgraph gets a Layout (a buffer, an offset,
// sizes and strides). Views (transpose, flatten, ...) are layouts over their source, not steps;
// computed values live in one scratch area (graph outputs in their own tensors); every op becomes
// one Step: an elementwise loop nest (broadcasts and cat's slices are strides), or a matmul.
// Run time: one pointer per buffer, then the steps in order. Nothing is shared between calls but
// the immutable program, so threads may run one plan at once.
//
// bf16 graphs run the same fp32 steps, as eager's bf16 kernels do (they compute in fp32 and round
// each op's result): inputs and bf16 constants are widened to fp32 (exactly), every computing
// step rounds what it writes to bf16 precision, and the outputs are narrowed at the end. Where
// earlier passes changed the ops (PrepareBinary's scalar operand as a bf16 tensor, eager's fp32;
// addmm as mm + add, two roundings for eager's one) results can differ from eager's by an ulp.
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace llga {

constexpr int kMaxDims = 6;

enum Space : uint8_t { kInput, kConstant, kScratch, kOutput };

// Where a value's elements are: a buffer (by space and index) and an element offset in it.
struct Ref {
  Space space = kScratch;
  int index = 0;
  int64_t offset = 0;
};

struct Layout {
  Ref ref;
  std::vector<int64_t> sizes, strides;
  int64_t numel() const { return c10::multiply_integers(sizes); }
};

// Buffers in the scratch and staging areas start 16 floats apart (loads use memcpy, no alignment is assumed).
inline int64_t padded(int64_t floats) { return (floats + 15) / 16 * 16; }

inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

inline bool is_contiguous(const Layout& l) {
  auto expected = contiguous_strides(l.sizes);
  for (size_t i = 0; i < l.sizes.size(); ++i)
    if (l.sizes[i] != 1 && l.strides[i] != expected[i]) return false;
  return true;
}

enum class Fn {
  kCopy, kAdd, kSub, kMul, kDiv, kMaximum, kMinimum,
  kRelu, kSigmoid, kTanh, kExp, kLog, kSqrt, kAbs, kNeg, kSquare, kClamp, kLeakyRelu, kElu,
  kHardSigmoid, kHardSwish, kSilu, kGelu, kGeluTanh
};

// An elementwise loop nest over the output's sizes: per operand (0 = the output, 1 and 2 the
// inputs) a stride per dim, 0 where the operand is broadcast. Dims that every operand walks as one
// are merged, so a dense op is a single loop.
struct Nest {
  int dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[3][kMaxDims] = {};
};

struct Step {
  enum Kind { kElementwise, kMatMul } kind = kElementwise;
  Fn fn = Fn::kCopy;
  Ref out, a, b, bias;
  bool has_bias = false;
  bool round_bf16 = false;  // its results rounded to bf16 precision (a bf16 graph's computing steps)
  float alpha = 1, lo = 0, hi = 0;  // add/sub alpha; clamp bounds; leaky_relu slope (alpha)
  Nest nest;
  // MatMul: out[p, i, j] = sum_k a[p, i, k] * b[p, k, j] (+ bias[i, j]), strides per (p, i/k, k/j).
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t as[3] = {}, bs[3] = {}, os[3] = {}, bias_s[2] = {};
};

struct SmallProgram {
  bool bf16 = false;  // the graph's tensors are bf16: inputs and outputs are staged as fp32 (below)
  size_t inputs = 0;
  std::vector<at::Tensor> constants;  // held (frozen: never written)
  std::vector<float*> constant_data;  // their memory, read once at compile time
  int64_t scratch_floats = 0;
  std::vector<std::vector<int64_t>> output_sizes;  // one per output buffer
  std::vector<int> outputs;                        // per subgraph output, its output buffer
  std::vector<Step> steps;
  // bf16: where each input and output buffer is staged as fp32, past the scratch floats.
  std::vector<int64_t> input_numel, input_at, output_at;
  int64_t staged_floats = 0;
};

// Runs the program on the inputs at the top of the stack, which it replaces by the outputs.
void run_plan(const SmallProgram& p, torch::jit::Stack& stack);

}  // namespace llga
