// The run time of a small-graph plan: the steps' loops (elementwise nests, matmuls, bf16 widening
// and narrowing) and run_plan, which runs a program (program.h) on one call's tensors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "jit/codegen/onednn/settings/settings.h"
#include "jit/codegen/onednn/small_plan/program.h"

// The steps' loops are the plan's whole cost: let gcc vectorize them (the library builds at -O2).
#pragma GCC optimize("O3")
#pragma GCC diagnostic ignored "-Wpsabi"  // Vec8 values never cross a call (always inlined)

namespace llga {

using torch::jit::Stack;

namespace {

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

}  // namespace

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

}  // namespace llga
