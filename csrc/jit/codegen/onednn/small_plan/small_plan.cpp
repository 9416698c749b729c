// The small-graph plan's compiler and its operator, llga::SmallPlan (see small_plan.h; the pass
// that forms it is plan_small_graph.cpp, the guard in front of it guard_shapes.cpp).
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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/small_plan/small_plan.h"

// The steps' loops are the plan's whole cost: let gcc vectorize them (the library builds at -O2).
#pragma GCC optimize("O3")
#pragma GCC diagnostic ignored "-Wpsabi"  // Vec8 values never cross a call (always inlined)

namespace llga {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Stack;
using torch::jit::TensorType;
using torch::jit::Value;

namespace {

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
int64_t padded(int64_t floats) { return (floats + 15) / 16 * 16; }

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

bool is_contiguous(const Layout& l) {
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

}  // namespace

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

namespace {

// ---- Run time ---------------------------------------------------------------------------------

template <class F>
[[gnu::always_inline]] inline void unary_inner(float* __restrict o, const float* __restrict a, int64_t n, int64_t so,
                                               int64_t sa, F f) {
  if (so == 1 && sa == 1)
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
  else
    for (int64_t i = 0; i < n; ++i) o[i * so] = f(a[i * sa]);
}

template <class F>
[[gnu::always_inline]] inline void binary_inner(float* __restrict o, const float* __restrict a, const float* __restrict b,
                                                int64_t n, int64_t so, int64_t sa, int64_t sb, F f) {
  if (so == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (so == 1 && sa == 1 && sb == 0) {
    const float y = *b;
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], y);
  } else if (so == 1 && sa == 0 && sb == 1) {
    const float x = *a;
    for (int64_t i = 0; i < n; ++i) o[i] = f(x, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i * so] = f(a[i * sa], b[i * sb]);
  }
}

// fp32 <-> bf16 as eager's casts: round to nearest even (NaN stays NaN), and widening is exact.
[[gnu::always_inline]] inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;  // NaN: quiet, so its bf16 half is NaN too (not Inf)
  else u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void widen_bf16(const c10::BFloat16* __restrict from, float* __restrict to, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(from);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(to + i, &u, sizeof u);
  }
}

void narrow_bf16(const float* __restrict from, c10::BFloat16* __restrict to, int64_t n) {
  uint16_t* bits = reinterpret_cast<uint16_t*>(to);
  for (int64_t i = 0; i < n; ++i) {
    float x = round_bf16(from[i]);
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    bits[i] = static_cast<uint16_t>(u >> 16);
  }
}

// Calls inner(o, a, b, n, so, sa, sb) once per row of the nest's last dim.
template <class Inner>
[[gnu::always_inline]] inline void for_each_row(const Nest& nest, float* o, const float* a, const float* b, Inner inner) {
  const int last = nest.dims - 1;
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= nest.sizes[d];
  int64_t index[kMaxDims] = {};
  for (int64_t r = 0; r < rows; ++r) {
    inner(o, a, b, nest.sizes[last], nest.strides[0][last], nest.strides[1][last], nest.strides[2][last]);
    for (int d = last - 1; d >= 0; --d) {
      o += nest.strides[0][d];
      a += nest.strides[1][d];
      b += nest.strides[2][d];
      if (++index[d] < nest.sizes[d]) break;
      o -= nest.strides[0][d] * nest.sizes[d];
      a -= nest.strides[1][d] * nest.sizes[d];
      b -= nest.strides[2][d] * nest.sizes[d];
      index[d] = 0;
    }
  }
}

template <class F>
[[gnu::always_inline]] inline void unary(const Nest& nest, float* o, const float* a, F f) {
  for_each_row(nest, o, a, a, [&](float* o, const float* a, const float*, int64_t n, int64_t so, int64_t sa, int64_t) __attribute__((always_inline)) {
    unary_inner(o, a, n, so, sa, f);
  });
}

template <class F>
[[gnu::always_inline]] inline void binary(const Nest& nest, float* o, const float* a, const float* b, F f) {
  for_each_row(nest, o, a, b, [&](float* o, const float* a, const float* b, int64_t n, int64_t so, int64_t sa, int64_t sb) __attribute__((always_inline)) {
    binary_inner(o, a, b, n, so, sa, sb, f);
  });
}

// NaN stays NaN wherever eager keeps it (relu and clamp compare, and a comparison with NaN is false).
// Compiled for AVX-512 and AVX2 too, picked at load time (the library's baseline is SSE2: rows of
// 50 floats are 13 SSE steps and 4 AVX-512 ones).
[[gnu::target_clones("avx512f", "avx2", "default")]] void elementwise(const Step& s, float* o, const float* a, const float* b) {
  const float alpha = s.alpha, lo = s.lo, hi = s.hi;
  switch (s.fn) {
    case Fn::kCopy: return unary(s.nest, o, a, [](float x) { return x; });
    case Fn::kAdd:
      if (alpha == 1) return binary(s.nest, o, a, b, [](float x, float y) { return x + y; });
      return binary(s.nest, o, a, b, [=](float x, float y) { return x + alpha * y; });
    case Fn::kSub:
      if (alpha == 1) return binary(s.nest, o, a, b, [](float x, float y) { return x - y; });
      return binary(s.nest, o, a, b, [=](float x, float y) { return x - alpha * y; });
    case Fn::kMul: return binary(s.nest, o, a, b, [](float x, float y) { return x * y; });
    case Fn::kDiv: return binary(s.nest, o, a, b, [](float x, float y) { return x / y; });
    case Fn::kRelu: return unary(s.nest, o, a, [](float x) { return x < 0 ? 0.f : x; });
    case Fn::kSigmoid: return unary(s.nest, o, a, [](float x) { return 1.f / (1.f + std::exp(-x)); });
    case Fn::kTanh: return unary(s.nest, o, a, [](float x) { return std::tanh(x); });
    case Fn::kExp: return unary(s.nest, o, a, [](float x) { return std::exp(x); });
    case Fn::kNeg: return unary(s.nest, o, a, [](float x) { return -x; });
    case Fn::kClamp:  // min(max(x, lo), hi), as eager (hi wins when lo > hi)
      return unary(s.nest, o, a, [=](float x) {
        float y = x < lo ? lo : x;
        return y > hi ? hi : y;
      });
    case Fn::kLeakyRelu: return unary(s.nest, o, a, [=](float x) { return x < 0 ? x * alpha : x; });
    case Fn::kMaximum:  // NaN if either is NaN, as torch.maximum
      return binary(s.nest, o, a, b, [](float x, float y) { return x != x ? x : (y != y ? y : (x > y ? x : y)); });
    case Fn::kMinimum:
      return binary(s.nest, o, a, b, [](float x, float y) { return x != x ? x : (y != y ? y : (x < y ? x : y)); });
    case Fn::kLog: return unary(s.nest, o, a, [](float x) { return std::log(x); });
    case Fn::kSqrt: return unary(s.nest, o, a, [](float x) { return std::sqrt(x); });
    case Fn::kAbs: return unary(s.nest, o, a, [](float x) { return std::fabs(x); });
    case Fn::kSquare: return unary(s.nest, o, a, [](float x) { return x * x; });
    case Fn::kElu: return unary(s.nest, o, a, [=](float x) { return x > 0 ? x : (x != x ? x : alpha * std::expm1(x)); });
    case Fn::kHardSigmoid:  // min(max(x + 3, 0), 6) / 6
      return unary(s.nest, o, a, [](float x) {
        float y = x + 3.f;
        return (y < 0.f ? 0.f : (y > 6.f ? 6.f : y)) / 6.f;
      });
    case Fn::kHardSwish:
      return unary(s.nest, o, a, [](float x) {
        float y = x + 3.f;
        return x * (y < 0.f ? 0.f : (y > 6.f ? 6.f : y)) / 6.f;
      });
    case Fn::kSilu: return unary(s.nest, o, a, [](float x) { return x / (1.f + std::exp(-x)); });
    case Fn::kGelu: return unary(s.nest, o, a, [](float x) { return 0.5f * x * (1.f + std::erf(x * float(M_SQRT1_2))); });
    case Fn::kGeluTanh:
      return unary(s.nest, o, a, [](float x) {
        constexpr float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
        return 0.5f * x * (1.f + std::tanh(kBeta * (x + kKappa * x * x * x)));
      });
  }
}

// A bf16 graph's elementwise step rounds its output in place afterwards (a second pass over a few
// hundred floats: cheaper than a rounding copy of every step's loop).
void round_output(const Nest& nest, float* o) {
  for_each_row(nest, o, o, o, [](float* o, const float*, const float*, int64_t n, int64_t so, int64_t, int64_t) {
    for (int64_t i = 0; i < n; ++i) o[i * so] = round_bf16(o[i * so]);
  });
}

// Dot product of n pairs with unit strides, in two 8-lane vector sums (gcc's vector extension:
// plain loops over a float array were left scalar or went through memory), added as a tree.
typedef float Vec8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline float hsum(const Vec8& v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

[[gnu::always_inline]] inline float dot_dense(const float* __restrict a, const float* __restrict b, int64_t n) {
  Vec8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  if (i + 8 <= n) {
    acc0 += load8(a + i) * load8(b + i);
    i += 8;
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return hsum(acc0 + acc1) + tail;
}

// Four dot products of a with b[0..3] at once (a row with four columns, or a column with four
// rows): a's loads are shared and eight sums are in flight (one would wait on each add's latency:
// matrix-vector work was bound by it).
[[gnu::always_inline]] inline void dot4_dense(const float* __restrict a, const float* const* b, int64_t n, float* out) {
  Vec8 acc[4][2] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const Vec8 x0 = load8(a + i), x1 = load8(a + i + 8);
    for (int c = 0; c < 4; ++c) {
      acc[c][0] += x0 * load8(b[c] + i);
      acc[c][1] += x1 * load8(b[c] + i + 8);
    }
  }
  for (int c = 0; c < 4; ++c) {
    float tail = 0;
    for (int64_t t = i; t < n; ++t) tail += a[t] * b[c][t];
    out[c] = hsum(acc[c][0] + acc[c][1]) + tail;
  }
}

// Output columns [j0, j1) of the matmul.
[[gnu::target_clones("avx512f", "avx2", "default")]] void matmul_columns(const Step& s, float* o, const float* a, const float* b,
                                                                         const float* bias, int64_t j0, int64_t j1) {
  if (s.m == 1 && s.n == 1 && j0 == 0 && j1 == 1 && s.as[2] == 1 && s.bs[1] == 1) {  // a dot product per batch (DeepAndWide's bmm)
    for (int64_t p = 0; p < s.batch; ++p) {
      float acc = dot_dense(a + p * s.as[0], b + p * s.bs[0], s.k);
      if (s.has_bias) acc += bias[0];
      o[p * s.os[0]] = s.round_bf16 ? round_bf16(acc) : acc;
    }
    return;
  }
  for (int64_t p = 0; p < s.batch; ++p) {
    const float* ap = a + p * s.as[0];
    const float* bp = b + p * s.bs[0];
    float* op = o + p * s.os[0];
    if (s.bs[1] != 1 && s.bs[2] == 1) {  // b's rows are dense: o[i, :] += a[i, k] * b[k, :]
      for (int64_t i = 0; i < s.m; ++i) {
        float* __restrict row = op + i * s.os[1];
        for (int64_t j = j0; j < j1; ++j) row[j] = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          const float x = ap[i * s.as[1] + k * s.as[2]];
          const float* __restrict brow = bp + k * s.bs[1];
          for (int64_t j = j0; j < j1; ++j) row[j] += x * brow[j];
        }
      }
    } else {
      const bool dense = s.as[2] == 1 && s.bs[1] == 1;
      int64_t i0 = 0;
      if (dense && j1 - j0 < 4) {  // a column or few (DeepAndWide's [64, 51] x [51, 1]): four rows at a time
        for (; i0 + 4 <= s.m; i0 += 4)
          for (int64_t j = j0; j < j1; ++j) {
            const float* rows[4] = {ap + i0 * s.as[1], ap + (i0 + 1) * s.as[1], ap + (i0 + 2) * s.as[1], ap + (i0 + 3) * s.as[1]};
            float acc[4];
            dot4_dense(bp + j * s.bs[2], rows, s.k, acc);
            for (int r = 0; r < 4; ++r) op[(i0 + r) * s.os[1] + j * s.os[2]] = acc[r];
          }
      }
      for (int64_t i = i0; i < s.m; ++i) {
        int64_t j = j0;
        for (; dense && j + 4 <= j1; j += 4) {
          const float* bj[4] = {bp + j * s.bs[2], bp + (j + 1) * s.bs[2], bp + (j + 2) * s.bs[2], bp + (j + 3) * s.bs[2]};
          float acc[4];
          dot4_dense(ap + i * s.as[1], bj, s.k, acc);
          for (int c = 0; c < 4; ++c) op[i * s.os[1] + (j + c) * s.os[2]] = acc[c];
        }
        for (; j < j1; ++j) {
          const float* ai = ap + i * s.as[1];
          const float* bj = bp + j * s.bs[2];
          float acc;
          if (dense) {
            acc = dot_dense(ai, bj, s.k);
          } else {
            acc = 0;
            for (int64_t k = 0; k < s.k; ++k) acc += ai[k * s.as[2]] * bj[k * s.bs[1]];
          }
          op[i * s.os[1] + j * s.os[2]] = acc;
        }
      }
    }
    if (s.has_bias)
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = j0; j < j1; ++j) op[i * s.os[1] + j * s.os[2]] += bias[i * s.bias_s[0] + j * s.bias_s[1]];
    if (s.round_bf16)  // once, after the bias: eager's bf16 matmuls accumulate (and add it) in fp32
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = j0; j < j1; ++j) op[i * s.os[1] + j * s.os[2]] = round_bf16(op[i * s.os[1] + j * s.os[2]]);
  }
}

// Large enough matmuls are split by output columns over PyTorch's intra-op threads, each thread
// reading its own columns' weights (MLP at batch 1: 20 us a call against 30 on one thread).
// parallel_for runs the body inline on one thread, or inside another parallel region.
void matmul(const Step& s, float* o, const float* a, const float* b, const float* bias) {
  constexpr int64_t kParallelMacs = 32 * 1024;
  const int64_t macs = s.batch * s.m * s.n * s.k;
  if (macs < kParallelMacs || s.n < 32) return matmul_columns(s, o, a, b, bias, 0, s.n);
  const int64_t grain = std::max<int64_t>(16, (s.n + at::get_num_threads() - 1) / at::get_num_threads());
  at::parallel_for(0, s.n, grain, [&](int64_t j0, int64_t j1) { matmul_columns(s, o, a, b, bias, j0, j1); });
}

void run_plan(const SmallProgram& p, Stack& stack) {
  const size_t n_out = p.output_sizes.size();
  // The scratch area of this thread (a plan runs to its end before its thread runs another).
  thread_local std::vector<float> scratch;
  const int64_t floats = p.scratch_floats + p.staged_floats;
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(floats);
  float* staged = scratch.data() + p.scratch_floats;
  // On the stack: a call allocates only its outputs (and dense copies of strided inputs).
  c10::SmallVector<float*, 8> inputs(p.inputs), outputs(n_out);
  auto args = torch::jit::last(stack, p.inputs);
  // The layouts assume dense inputs: others (a transposed or sliced view) are copied so first,
  // once per call, which for tensors this small costs less than a fallback to the interpreter.
  c10::SmallVector<at::Tensor, 8> dense(p.inputs);
  for (size_t i = 0; i < p.inputs; ++i) {
    dense[i] = args[i].toTensor().contiguous();
    if (p.bf16) {
      inputs[i] = staged + p.input_at[i];
      widen_bf16(dense[i].const_data_ptr<c10::BFloat16>(), inputs[i], p.input_numel[i]);
    } else {
      inputs[i] = const_cast<float*>(dense[i].const_data_ptr<float>());
    }
  }
  c10::SmallVector<at::Tensor, 4> results;
  for (size_t i = 0; i < n_out; ++i) {
    results.push_back(at::empty(p.output_sizes[i], at::TensorOptions().dtype(p.bf16 ? at::kBFloat16 : at::kFloat)));
    outputs[i] = p.bf16 ? staged + p.output_at[i] : results.back().data_ptr<float>();
  }
  auto ptr = [&](const Ref& r) -> float* {
    switch (r.space) {
      case kInput: return inputs[r.index] + r.offset;
      case kConstant: return p.constant_data[r.index] + r.offset;
      case kScratch: return scratch.data() + r.offset;
      case kOutput: return outputs[r.index] + r.offset;
    }
    return nullptr;
  };
  for (const Step& s : p.steps) {
    if (s.kind == Step::kMatMul)
      matmul(s, ptr(s.out), ptr(s.a), ptr(s.b), s.has_bias ? ptr(s.bias) : nullptr);
    else
      elementwise(s, ptr(s.out), ptr(s.a), ptr(s.b));
    if (s.round_bf16 && s.kind == Step::kElementwise) round_output(s.nest, ptr(s.out));
  }
  if (p.bf16)
    for (size_t i = 0; i < n_out; ++i) narrow_bf16(outputs[i], results[i].data_ptr<c10::BFloat16>(), results[i].numel());
  torch::jit::drop(stack, p.inputs);
  for (int o : p.outputs) stack.emplace_back(results[o]);
  runtime::stats().plan_runs.fetch_add(1, std::memory_order_relaxed);
}

// ---- Compile time -----------------------------------------------------------------------------

class Compiler {
 public:
  Compiler(const Graph& g, SmallProgram& p) : g_(g), p_(p) {}

  bool compile() {
    // One dtype for the whole graph, its first input's (fp32 or bf16): graphs mixing dtypes (which
    // eager would promote) get no plan.
    for (const Value* v : g_.inputs())
      if (auto t = v->type()->cast<TensorType>(); t && t->scalarType()) {
        dtype_ = *t->scalarType();
        break;
      }
    if (dtype_ != at::kFloat && dtype_ != at::kBFloat16) return fail("a graph of neither fp32 nor bf16 tensors");
    p_.bf16 = dtype_ == at::kBFloat16;
    for (const Value* v : g_.inputs()) {
      auto sizes = profiled_sizes(v);
      if (!sizes) return fail("input " + v->debugName() + " is not a " + dtype_name() + " tensor of known sizes");
      Layout l{{kInput, static_cast<int>(p_.inputs++), 0}, *sizes, contiguous_strides(*sizes)};  // made dense by run_plan
      layouts_[v] = l;
    }
    for (const Value* v : g_.outputs()) wanted_.insert(v);
    for (const Node* n : g_.nodes()) {
      if (n->kind() == c10::prim::Constant || n->kind() == c10::prim::ListConstruct) continue;
      auto handle = find_handler(n);
      if (!handle) return fail(std::string(n->kind().toQualString()) + " has no step in the small-graph plan");
      if (!(*handle)(*this, n)) return false;
      for (const Value* v : n->outputs()) {
        auto sizes = profiled_sizes(v);
        if (!sizes || !layouts_.count(v) || layouts_.at(v).sizes != *sizes)
          return fail(std::string(n->kind().toQualString()) + "'s output differs from its profile");
      }
    }
    const int64_t max_macs = small_plan_max_macs(rows_, p_.bf16);
    if (macs_ > max_macs) return fail("more than " + std::to_string(max_macs) + " multiply-adds");
    std::unordered_map<const Value*, int> output_of;
    for (const Value* v : g_.outputs()) {
      if (!layouts_.count(v)) return fail("an output is no tensor the plan computes");
      auto done = output_of.find(v);
      if (done != output_of.end()) {
        p_.outputs.push_back(done->second);
        continue;
      }
      Layout l = layouts_.at(v);
      // Eager returns a view of an input (or of another output) as a view, which a caller may
      // write through: such graphs stay with the interpreter.
      if (l.ref.space == kInput || (l.ref.space == kOutput && owner_.at(l.ref.index) != v))
        return fail("an output is a view of an input or of another output");
      if (l.ref.space != kOutput) {  // a view of an intermediate or a constant: copied out
        Layout copy = new_output(l.sizes, v);
        elementwise_step(Fn::kCopy, copy, {&l});
        l = copy;
      }
      output_of[v] = l.ref.index;
      p_.outputs.push_back(l.ref.index);
    }
    p_.scratch_floats = scratch_;
    if (!dropped_steps_.empty()) {
      std::vector<Step> kept;
      for (size_t i = 0; i < p_.steps.size(); ++i)
        if (!dropped_steps_.count(i)) kept.push_back(p_.steps[i]);
      p_.steps = std::move(kept);
    }
    if (p_.bf16) {  // the staging area: inputs, then outputs
      for (size_t i = 0; i < p_.inputs; ++i) {
        p_.input_numel.push_back(layouts_.at(g_.inputs()[i]).numel());
        p_.input_at.push_back(p_.staged_floats);
        p_.staged_floats += padded(p_.input_numel.back());
      }
      for (const auto& sizes : p_.output_sizes) {
        p_.output_at.push_back(p_.staged_floats);
        p_.staged_floats += padded(c10::multiply_integers(sizes));
      }
    }
    for (const at::Tensor& t : p_.constants) p_.constant_data.push_back(const_cast<float*>(t.const_data_ptr<float>()));
    return true;
  }

  const std::string& why() const { return why_; }

  using Handler = std::function<bool(Compiler&, const Node*)>;

  // The handler of n's step (the op table's plan_step for its schema), if any.
  static std::optional<Handler> find_handler(const Node* n) {
    const OpEntry* e = find_entry(n);
    if (!e || e->plan_step == PlanStep::kNone) return std::nullopt;
    return handler(e->plan_step);
  }

 private:

  bool fail(std::string reason) {
    why_ = std::move(reason);
    return false;
  }

  const char* dtype_name() const { return p_.bf16 ? "bf16" : "fp32"; }

  std::optional<std::vector<int64_t>> profiled_sizes(const Value* v) const {
    auto t = v->type()->cast<TensorType>();
    if (!t || t->scalarType() != dtype_ || !t->device() || !t->device()->is_cpu()) return std::nullopt;
    auto sizes = t->sizes().concrete_sizes();
    if (!sizes || sizes->size() > static_cast<size_t>(kMaxDims)) return std::nullopt;
    return sizes;
  }

  // A tensor operand: its layout (a constant tensor is held by the program). The pointer stays
  // valid while more layouts are added (an unordered_map does not move its elements).
  const Layout* operand(const Value* v) {
    if (auto it = layouts_.find(v); it != layouts_.end()) return &it->second;
    auto c = torch::jit::toIValue(v);
    if (!c) return nullptr;
    at::Tensor t;
    if (c->isTensor()) {
      t = c->toTensor();
      if (t.scalar_type() != dtype_ || !t.device().is_cpu() || t.layout() != c10::kStrided || t.is_neg() || t.is_conj() ||
          t.dim() > kMaxDims)
        return nullptr;
      if (p_.bf16) t = t.contiguous().to(at::kFloat);  // exact; the steps read fp32
    } else if (c->isDouble() || c->isInt()) {  // a Scalar operand
      t = at::scalar_tensor(c->toScalar(), at::kFloat);
    } else {
      return nullptr;
    }
    p_.constants.push_back(t);
    Layout l{{kConstant, static_cast<int>(p_.constants.size() - 1), 0}, t.sizes().vec(), t.strides().vec()};
    return &(layouts_[v] = l);
  }

  static std::optional<double> number(const Value* v) {
    auto c = torch::jit::toIValue(v);
    if (!c || !(c->isDouble() || c->isInt())) return std::nullopt;
    return c->toScalar().toDouble();
  }

  static std::optional<int64_t> int_arg(const Value* v) {
    auto c = torch::jit::toIValue(v);
    if (!c || !c->isInt()) return std::nullopt;
    return c->toInt();
  }

  // d as a dim of `rank` dims (negative counts from the end), if it is one.
  static std::optional<int64_t> wrap_dim(std::optional<int64_t> d, int64_t rank) {
    if (!d || *d < -rank || *d >= rank) return std::nullopt;
    return *d < 0 ? *d + rank : *d;
  }

  static std::optional<std::vector<int64_t>> int_list(const Value* v) {
    auto c = torch::jit::toIValue(v);
    if (!c || !c->isIntList()) return std::nullopt;
    return c->toIntVector();
  }

  Layout new_output(const std::vector<int64_t>& sizes, const Value* v) {
    p_.output_sizes.push_back(sizes);
    owner_.push_back(v);
    return Layout{{kOutput, static_cast<int>(p_.output_sizes.size() - 1), 0}, sizes, contiguous_strides(sizes)};
  }

  // The layout of a computed value: its own output tensor if the subgraph returns it, else a place
  // in the scratch area (places 16 floats apart: loads use memcpy, no alignment is assumed).
  Layout produce(const Value* v, const std::vector<int64_t>& sizes) {
    return layouts_[v] = wanted_.count(v) ? new_output(sizes, v) : scratch_layout(sizes);
  }

  Layout scratch_layout(const std::vector<int64_t>& sizes) {
    Layout l{{kScratch, 0, scratch_}, sizes, contiguous_strides(sizes)};
    scratch_ += padded(l.numel());
    return l;
  }

  bool within_limits(const Node* n, const std::vector<int64_t>& sizes) {
    if (c10::multiply_integers(sizes) > kSmallPlanMaxElements)
      return fail(std::string(n->kind().toQualString()) + " computes more than " + std::to_string(kSmallPlanMaxElements) + " elements");
    return true;
  }

  static std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    std::vector<int64_t> out(std::max(a.size(), b.size()));
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
      if (x != y && x != 1 && y != 1) return std::nullopt;
      out[out.size() - 1 - i] = x == 1 ? y : x;
    }
    return out;
  }

  // Adds an elementwise step writing `out` from the operands (each broadcast to out's sizes).
  void elementwise_step(Fn fn, const Layout& out, std::vector<const Layout*> in, float alpha = 1, float lo = 0, float hi = 0) {
    Step s;
    s.fn = fn;
    s.round_bf16 = p_.bf16 && fn != Fn::kCopy;  // a copy moves values that are bf16 already
    s.alpha = alpha, s.lo = lo, s.hi = hi;
    s.out = out.ref;
    s.a = in[0]->ref;
    s.b = in.size() > 1 ? in[1]->ref : in[0]->ref;
    const size_t rank = out.sizes.size();
    std::vector<std::array<int64_t, 3>> dims;  // per dim: the three operands' strides
    std::vector<int64_t> sizes;
    for (size_t d = 0; d < rank; ++d) {
      std::array<int64_t, 3> st{out.strides[d], 0, 0};
      for (size_t k = 0; k < 2; ++k) {
        const Layout& l = *in[std::min(k, in.size() - 1)];
        int64_t ld = static_cast<int64_t>(d) - static_cast<int64_t>(rank - l.sizes.size());
        st[k + 1] = (ld < 0 || l.sizes[ld] == 1) ? 0 : l.strides[ld];
      }
      if (out.sizes[d] == 1) continue;  // walks nothing
      // Merged with the dim before when every operand steps over it as one (outer = inner * size).
      if (!dims.empty() && dims.back()[0] == st[0] * out.sizes[d] && dims.back()[1] == st[1] * out.sizes[d] &&
          dims.back()[2] == st[2] * out.sizes[d]) {
        sizes.back() *= out.sizes[d];
        dims.back() = st;
        continue;
      }
      sizes.push_back(out.sizes[d]);
      dims.push_back(st);
    }
    if (sizes.empty()) {
      sizes.push_back(1);
      dims.push_back({1, 1, 1});
    }
    s.nest.dims = static_cast<int>(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) {
      s.nest.sizes[d] = sizes[d];
      for (int k = 0; k < 3; ++k) s.nest.strides[k][d] = dims[d][k];
    }
    p_.steps.push_back(s);
  }

  bool unary_op(const Node* n, Fn fn, float alpha = 1, float lo = 0, float hi = 0) {
    const Layout* x = operand(n->input(0));
    if (!x) return fail("an operand of " + std::string(n->kind().toQualString()) + " is no float tensor");
    if (!within_limits(n, x->sizes)) return false;
    auto emit = [this, fn, in = *x, alpha, lo, hi](const Layout& out) { elementwise_step(fn, out, {&in}, alpha, lo, hi); };
    remakes_[n->output()] = {p_.steps.size(), emit};
    emit(produce(n->output(), x->sizes));
    return true;
  }

  bool binary_op(const Node* n, Fn fn, float alpha = 1) {
    const Layout* x = operand(n->input(0));
    const Layout* y = operand(n->input(1));
    if (!x || !y) return fail("an operand of " + std::string(n->kind().toQualString()) + " is no float tensor");
    auto sizes = broadcast(x->sizes, y->sizes);
    if (!sizes) return fail("operands that do not broadcast");
    if (!within_limits(n, *sizes)) return false;
    auto emit = [this, fn, a = *x, b = *y, alpha](const Layout& out) { elementwise_step(fn, out, {&a, &b}, alpha); };
    remakes_[n->output()] = {p_.steps.size(), emit};
    emit(produce(n->output(), *sizes));
    return true;
  }

  bool binary_alpha(const Node* n, Fn fn) {
    auto alpha = n->inputs().size() > 2 ? number(n->input(2)) : std::optional<double>(1);
    if (!alpha) return fail("alpha is not a constant");
    return binary_op(n, fn, static_cast<float>(*alpha));
  }

  bool clamp(const Node* n) {
    auto bound = [&](size_t i, float otherwise) -> std::optional<float> {
      if (i >= n->inputs().size() || n->input(i)->type()->kind() == c10::TypeKind::NoneType) return otherwise;
      auto v = number(n->input(i));
      if (!v || std::isnan(*v)) return std::nullopt;
      return static_cast<float>(*v);
    };
    auto lo = bound(1, -INFINITY), hi = bound(2, INFINITY);
    if (!lo || !hi) return fail("clamp bounds that are not constant numbers");
    return unary_op(n, Fn::kClamp, 1, *lo, *hi);
  }

  bool relu6(const Node* n) { return unary_op(n, Fn::kClamp, 1, 0, 6); }

  bool leaky_relu(const Node* n) {
    auto slope = number(n->input(1));
    return slope ? unary_op(n, Fn::kLeakyRelu, static_cast<float>(*slope)) : fail("leaky_relu slope is not a constant");
  }

  bool elu(const Node* n) {
    auto alpha = number(n->input(1)), scale = number(n->input(2)), input_scale = number(n->input(3));
    if (!alpha || scale != 1.0 || input_scale != 1.0) return fail("elu with a scale");
    return unary_op(n, Fn::kElu, static_cast<float>(*alpha));
  }

  bool gelu(const Node* n) {
    auto mode = torch::jit::toIValue(n->input(1));
    if (mode && mode->isString() && mode->toStringRef() == "none") return unary_op(n, Fn::kGelu);
    if (mode && mode->isString() && mode->toStringRef() == "tanh") return unary_op(n, Fn::kGeluTanh);
    return fail("gelu of an unknown approximation");
  }

  // A view: a new layout over the source's memory.
  bool view(const Node* n, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    Layout src = layouts_.at(n->input(0));
    layouts_[n->output()] = Layout{src.ref, std::move(sizes), std::move(strides)};
    return true;
  }

  // A layout for the source's values as a dense tensor: the source's own if it is dense, else a
  // copy in the scratch area.
  std::optional<Layout> dense(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x) return std::nullopt;
    if (is_contiguous(*x)) return *x;
    Layout copy = scratch_layout(x->sizes);
    elementwise_step(Fn::kCopy, copy, {x});
    return copy;
  }

  // reshape, view, flatten: the output's profiled sizes over dense memory (the guard fixed the input
  // sizes, so any size list, constant or computed, gives them).
  bool reshape(const Node* n) {
    auto sizes = profiled_sizes(n->output());
    auto src = dense(n);
    if (!sizes || !src) return fail("a reshape of unknown sizes");
    if (c10::multiply_integers(*sizes) != src->numel()) return fail("a reshape that changes the number of elements");
    layouts_[n->output()] = Layout{src->ref, *sizes, contiguous_strides(*sizes)};
    return true;
  }

  // The source's dims in `order` (each once).
  bool permuted(const Node* n, const std::vector<int64_t>& order) {
    const Layout* x = operand(n->input(0));
    if (!x || order.size() != x->sizes.size()) return fail("a permutation of another rank");
    const int64_t r = static_cast<int64_t>(order.size());
    std::vector<int64_t> sizes, strides;
    std::vector<bool> seen(r);
    for (int64_t d : order) {
      auto at = wrap_dim(d, r);
      if (!at || seen[*at]) return fail("a permutation that is none");
      seen[*at] = true;
      sizes.push_back(x->sizes[*at]);
      strides.push_back(x->strides[*at]);
    }
    return view(n, sizes, strides);
  }

  bool permute(const Node* n) {
    auto order = int_list(n->input(1));
    return order ? permuted(n, *order) : fail("permute of unknown dims");
  }

  bool transpose(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x) return fail("transpose of no float tensor");
    const int64_t r = static_cast<int64_t>(x->sizes.size());
    auto d0 = wrap_dim(int_arg(n->input(1)), r), d1 = wrap_dim(int_arg(n->input(2)), r);
    if (!d0 || !d1) return fail("transpose of unknown dims");
    std::vector<int64_t> order(r);
    for (int64_t i = 0; i < r; ++i) order[i] = i;
    std::swap(order[*d0], order[*d1]);
    return permuted(n, order);
  }

  bool t(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x || x->sizes.size() > 2) return fail("t() of more than 2 dims");
    if (x->sizes.size() < 2) return view(n, x->sizes, x->strides);
    return permuted(n, {1, 0});
  }

  bool unsqueeze(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x) return fail("unsqueeze of no float tensor");
    const int64_t r = static_cast<int64_t>(x->sizes.size()) + 1;
    auto d = wrap_dim(int_arg(n->input(1)), r);
    if (!d) return fail("unsqueeze of an unknown dim");
    const int64_t at = *d;
    std::vector<int64_t> sizes = x->sizes, strides = x->strides;
    int64_t stride = at < r - 1 ? sizes[at] * strides[at] : 1;
    sizes.insert(sizes.begin() + at, 1);
    strides.insert(strides.begin() + at, stride);
    return view(n, sizes, strides);
  }

  bool squeeze(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x) return fail("squeeze of no float tensor");
    const int64_t r = static_cast<int64_t>(x->sizes.size());
    if (r == 0) return view(n, x->sizes, x->strides);
    auto d = wrap_dim(int_arg(n->input(1)), r);
    if (!d) return fail("squeeze of an unknown dim");
    std::vector<int64_t> sizes = x->sizes, strides = x->strides;
    if (sizes[*d] == 1) {
      sizes.erase(sizes.begin() + *d);
      strides.erase(strides.begin() + *d);
    }
    return view(n, sizes, strides);
  }

  bool identity(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x) return fail("an operand is no float tensor");
    return view(n, x->sizes, x->strides);
  }

  bool contiguous(const Node* n) {
    auto src = dense(n);
    if (!src) return fail("an operand is no float tensor");
    layouts_[n->output()] = *src;
    return true;
  }

  // out = a @ b (+ bias), a: [..., m, k] (leading dims folded into m, or a batch matching b's),
  // b: [k, n] or [batch, k, n].
  bool matmul_op(const Node* n, const Layout& a, const Layout& b, const Layout* bias) {
    const size_t ra = a.sizes.size(), rb = b.sizes.size();
    if (ra < 2 || rb < 2 || rb > 3 || (rb == 3 && ra != 3)) return fail("a matmul of ranks the plan has no step for");
    Step s;
    s.kind = Step::kMatMul;
    s.round_bf16 = p_.bf16;
    s.k = a.sizes[ra - 1];
    if (b.sizes[rb - 2] != s.k) return fail("matmul operands that do not match");
    s.n = b.sizes[rb - 1];
    std::vector<int64_t> out_sizes(a.sizes.begin(), a.sizes.end() - 1);
    out_sizes.push_back(s.n);
    if (rb == 3) {
      if (a.sizes[0] != b.sizes[0]) return fail("a batched matmul that broadcasts");
      s.batch = a.sizes[0];
      s.m = a.sizes[1];
      s.as[0] = a.strides[0], s.bs[0] = b.strides[0];
      s.as[1] = a.strides[1];
    } else {
      // The leading dims folded into m rows at one stride: walked from the inside out, size-1
      // dims skipped (their strides are arbitrary: unsqueeze, permute), each other dim must step
      // as one with those inside it.
      s.m = 1;
      s.as[1] = a.strides[ra - 2];
      int64_t expected = -1;  // the stride the next dim of size > 1 must have
      for (size_t d = ra - 1; d-- > 0;) {
        s.m *= a.sizes[d];
        if (a.sizes[d] == 1) continue;
        if (expected < 0)
          s.as[1] = a.strides[d];
        else if (a.strides[d] != expected)
          return fail("a matmul over strided rows");
        expected = a.strides[d] * a.sizes[d];
      }
    }
    s.as[2] = a.strides[ra - 1];
    s.bs[1] = b.strides[rb - 2], s.bs[2] = b.strides[rb - 1];
    if (!within_limits(n, out_sizes)) return false;
    macs_ += s.batch * s.m * s.n * s.k;
    rows_ = std::max(rows_, s.batch * s.m);
    Layout out = produce(n->output(), out_sizes);
    s.os[0] = s.m * s.n, s.os[1] = s.n, s.os[2] = 1;
    if (bias) {
      auto sizes = broadcast(bias->sizes, {s.m, s.n});
      if (bias->sizes.size() > 2 || !sizes || *sizes != std::vector<int64_t>{s.m, s.n}) return fail("a bias that does not broadcast");
      size_t r = bias->sizes.size();
      s.bias_s[0] = r == 2 && bias->sizes[0] != 1 ? bias->strides[0] : 0;
      s.bias_s[1] = r >= 1 && bias->sizes[r - 1] != 1 ? bias->strides[r - 1] : 0;
      s.bias = bias->ref;
      s.has_bias = true;
    }
    s.out = out.ref, s.a = a.ref, s.b = b.ref;
    p_.steps.push_back(s);
    return true;
  }

  bool matmul(const Node* n) {
    const Layout* x = operand(n->input(0));
    const Layout* y = operand(n->input(1));
    if (!x || !y) return fail("a matmul operand is no float tensor");
    return matmul_op(n, *x, *y, nullptr);
  }

  bool linear(const Node* n) {
    const Layout* x = operand(n->input(0));
    if (!x) return fail("a linear operand is no float tensor");
    const Layout* w = operand(n->input(1));
    if (!w || w->sizes.size() != 2) return fail("a linear weight that is no matrix");
    Layout wt{w->ref, {w->sizes[1], w->sizes[0]}, {w->strides[1], w->strides[0]}};  // weight.t()
    const Layout* bias = nullptr;
    if (n->input(2)->type()->kind() != c10::TypeKind::NoneType && !(bias = operand(n->input(2))))
      return fail("a linear bias that is no float tensor");
    return matmul_op(n, *x, wt, bias);
  }

  bool addmm(const Node* n) {
    auto beta = number(n->input(3)), alpha = number(n->input(4));
    if (!beta || !alpha || *beta != 1 || *alpha != 1) return fail("addmm with beta or alpha other than 1");
    const Layout* bias = operand(n->input(0));
    const Layout* x = operand(n->input(1));
    const Layout* y = operand(n->input(2));
    if (!bias || !x || !y || x->sizes.size() != 2 || y->sizes.size() != 2) return fail("addmm operands that are no float matrices");
    return matmul_op(n, *x, *y, bias);
  }

  bool cat(const Node* n) {
    const Node* list = n->input(0)->node();
    auto dim = int_arg(n->input(1));
    if (list->kind() != c10::prim::ListConstruct || list->inputs().empty()) return fail("cat of a list the plan cannot see");
    std::vector<Layout> parts;
    for (const Value* v : list->inputs()) {
      const Layout* l = operand(v);
      if (!l) return fail("cat of a tensor that is no float tensor");
      parts.push_back(*l);
    }
    const int64_t r = static_cast<int64_t>(parts[0].sizes.size());
    auto wrapped = wrap_dim(dim, r);
    if (!wrapped) return fail("cat dim out of range");
    const int64_t d = *wrapped;
    std::vector<int64_t> sizes = parts[0].sizes;
    sizes[d] = 0;
    for (const Layout& part : parts) {
      if (static_cast<int64_t>(part.sizes.size()) != r) return fail("cat of tensors of different ranks");
      for (int64_t i = 0; i < r; ++i)
        if (i != d && part.sizes[i] != sizes[i]) return fail("cat of tensors of different sizes");
      sizes[d] += part.sizes[d];
    }
    if (!within_limits(n, sizes)) return false;
    Layout out = produce(n->output(), sizes);
    int64_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {  // each part is computed or copied into its slice of the output
      const Layout& part = parts[i];
      Layout slice{{out.ref.space, out.ref.index, out.ref.offset + at * out.strides[d]}, part.sizes, out.strides};
      if (!into_cat_slice(list, list->inputs()[i], slice)) elementwise_step(Fn::kCopy, slice, {&part});
      at += part.sizes[d];
    }
    return true;
  }

  // Moves the elementwise step that computed v to the end, writing v's slice of a cat's output
  // instead of a place of its own (DeepAndWide's clamp, then a copy of its 3,200 floats), where
  // nothing but this cat's list reads v (not a view, not the graph's return either: each is a use).
  // The step's operands were all computed before it.
  bool into_cat_slice(const Node* list, const Value* v, const Layout& slice) {
    auto remake = remakes_.find(v);
    if (remake == remakes_.end() || v->uses().size() != 1 || list->output()->uses().size() != 1) return false;
    dropped_steps_.insert(remake->second.first);
    remake->second.second(slice);
    layouts_[v] = slice;
    return true;
  }

  bool dropout(const Node* n) {
    auto train = torch::jit::toIValue(n->input(2));
    if (!train || !train->isBool() || train->toBool()) return fail("dropout in training mode");
    return identity(n);
  }

  // Table handlers: an elementwise op of one Fn, or a member function of the compiler.
  static Handler unary_step(Fn fn) { return [fn](Compiler& c, const Node* n) { return c.unary_op(n, fn); }; }
  static Handler binary_step(Fn fn) { return [fn](Compiler& c, const Node* n) { return c.binary_op(n, fn); }; }
  static Handler binary_alpha_step(Fn fn) { return [fn](Compiler& c, const Node* n) { return c.binary_alpha(n, fn); }; }
  static Handler by(bool (Compiler::*method)(const Node*)) {
    return [method](Compiler& c, const Node* n) { return (c.*method)(n); };
  }

  // What computes each step the op table names (op_table.cpp gives each schema its PlanStep).
  static Handler handler(PlanStep step) {
    switch (step) {
      case PlanStep::kAdd: return binary_alpha_step(Fn::kAdd);
      case PlanStep::kSub: return binary_alpha_step(Fn::kSub);
      case PlanStep::kMul: return binary_step(Fn::kMul);
      case PlanStep::kDiv: return binary_step(Fn::kDiv);
      case PlanStep::kMaximum: return binary_step(Fn::kMaximum);
      case PlanStep::kMinimum: return binary_step(Fn::kMinimum);
      case PlanStep::kRelu: return unary_step(Fn::kRelu);
      case PlanStep::kAbs: return unary_step(Fn::kAbs);
      case PlanStep::kSquare: return unary_step(Fn::kSquare);
      case PlanStep::kSqrt: return unary_step(Fn::kSqrt);
      case PlanStep::kLog: return unary_step(Fn::kLog);
      case PlanStep::kHardSigmoid: return unary_step(Fn::kHardSigmoid);
      case PlanStep::kHardSwish: return unary_step(Fn::kHardSwish);
      case PlanStep::kSilu: return unary_step(Fn::kSilu);
      case PlanStep::kSigmoid: return unary_step(Fn::kSigmoid);
      case PlanStep::kTanh: return unary_step(Fn::kTanh);
      case PlanStep::kExp: return unary_step(Fn::kExp);
      case PlanStep::kNeg: return unary_step(Fn::kNeg);
      case PlanStep::kRelu6: return by(&Compiler::relu6);
      case PlanStep::kGelu: return by(&Compiler::gelu);
      case PlanStep::kElu: return by(&Compiler::elu);
      case PlanStep::kClamp: return by(&Compiler::clamp);
      case PlanStep::kLeakyRelu: return by(&Compiler::leaky_relu);
      case PlanStep::kTranspose: return by(&Compiler::transpose);
      case PlanStep::kT: return by(&Compiler::t);
      case PlanStep::kPermute: return by(&Compiler::permute);
      case PlanStep::kUnsqueeze: return by(&Compiler::unsqueeze);
      case PlanStep::kSqueeze: return by(&Compiler::squeeze);
      case PlanStep::kReshape: return by(&Compiler::reshape);
      case PlanStep::kContiguous: return by(&Compiler::contiguous);
      case PlanStep::kDropout: return by(&Compiler::dropout);
      case PlanStep::kCat: return by(&Compiler::cat);
      case PlanStep::kMatmul: return by(&Compiler::matmul);
      case PlanStep::kLinear: return by(&Compiler::linear);
      case PlanStep::kAddmm: return by(&Compiler::addmm);
      case PlanStep::kNone: break;
    }
    return nullptr;
  }

  const Graph& g_;
  SmallProgram& p_;
  std::unordered_map<const Value*, Layout> layouts_;
  std::unordered_set<const Value*> wanted_;  // the subgraph's outputs
  std::vector<const Value*> owner_;          // per output buffer, the value computed into it
  // Per value an elementwise step computed: that step's index, and how to emit it again writing
  // another layout (cat places such values straight into their slice: into_cat_slice).
  std::unordered_map<const Value*, std::pair<size_t, std::function<void(const Layout&)>>> remakes_;
  std::unordered_set<size_t> dropped_steps_;  // steps emitted again elsewhere
  at::ScalarType dtype_ = at::kFloat;
  int64_t scratch_ = 0, macs_ = 0, rows_ = 0;
  std::string why_;
};

}  // namespace

bool small_plan_has_step(const Node* n) { return Compiler::find_handler(n).has_value(); }

namespace {

std::shared_ptr<const SmallProgram> compile(const Graph& subgraph, std::string* why) {
  auto p = std::make_shared<SmallProgram>();
  Compiler c(subgraph, *p);
  if (!c.compile()) {
    if (why) *why = c.why();
    return nullptr;
  }
  runtime::stats().plan_compilations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

// The programs PlanSmallGraph compiled, by the id it gave the node, until the node's operator
// takes its program. The interpreter runs a copy of the graph (attributes copied, subgraphs
// copied too), so the id, not the subgraph, finds it. An entry lives while the graph the pass
// planned does; one whose graph is gone (a plan no operator was made for) goes at the next plan.
struct KeptPrograms {
  std::mutex mutex;
  int64_t next_id = 1;
  std::unordered_map<int64_t, std::pair<std::weak_ptr<Graph>, std::shared_ptr<const SmallProgram>>> by_id;
};
KeptPrograms& kept_programs() {
  static KeptPrograms kept;
  return kept;
}
const c10::Symbol kPlanId = c10::Symbol::attr("plan_id");

std::shared_ptr<const SmallProgram> program_of(const Node* plan) {
  if (plan->hasAttribute(kPlanId)) {
    KeptPrograms& kept = kept_programs();
    std::lock_guard<std::mutex> lock(kept.mutex);
    auto it = kept.by_id.find(plan->i(kPlanId));
    if (it != kept.by_id.end()) return it->second.second;
  }
  std::string why;
  auto program = compile(*plan->g(c10::attr::Subgraph), &why);
  TORCH_CHECK(program, "torch_llga: a small-graph plan no longer compiles (", why, ")");
  return program;
}

}  // namespace

bool compile_small_plan(Node* plan, std::string* why) {
  std::shared_ptr<Graph> subgraph = plan->g(c10::attr::Subgraph);
  auto program = compile(*subgraph, why);
  if (!program) return false;
  KeptPrograms& kept = kept_programs();
  std::lock_guard<std::mutex> lock(kept.mutex);
  for (auto it = kept.by_id.begin(); it != kept.by_id.end();)
    it = it->second.first.expired() ? kept.by_id.erase(it) : std::next(it);
  int64_t id = kept.next_id++;
  kept.by_id[id] = {subgraph, program};
  plan->i_(kPlanId, id);
  return true;
}

namespace {

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        kSmallPlan,
        [](const Node* node) -> torch::jit::Operation {
          auto program = program_of(node);
          return [program](Stack& stack) { run_plan(*program, stack); };
        },
        c10::AliasAnalysisKind::PURE_FUNCTION),
});

}  // namespace

}  // namespace llga
