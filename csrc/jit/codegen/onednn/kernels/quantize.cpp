// llga::quantize_per_tensor (quantize.h). PyTorch's CPU quantize (fbgemm's, on x86) computes a
// code as clamp(round_half_even(min(x * (1 / scale), 2^31 - 128)) + zero_point) in int32, with
// 1 / scale rounded to float and the int32 add wrapping; NaN takes the min's second operand. This
// kernel does the same operations with 16 values a register, so its codes are PyTorch's bit for bit
// (test_pt2e.py checks halves, NaN, infinities and huge values), on PyTorch's intra-op threads.
// PyTorch's took 7 us for BERT-base's 128 x 768 hot and 8-13 in the model.
#include "jit/codegen/onednn/kernels/quantize.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "jit/codegen/onednn/kernels/quantizing_op.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/cpu_features.h"
#include "onednn/pooled_qtensor.h"

namespace llga {

namespace {

// 16 values' codes, clamped to [lo, hi] (NaN: min gives top).
[[gnu::target("avx512f")]] inline __m512i codes(__m512 v, __m512 inv, __m512 top, __m512i zp, __m512i lo, __m512i hi) {
  __m512i r = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_mul_ps(v, inv), top));
  return _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(r, zp), lo), hi);
}

[[gnu::target("avx512f")]] void quantize_avx512(const float* x, uint8_t* out, int64_t n, float inverse_scale,
                                                int32_t zero_point, int32_t lowest, int32_t highest) {
  const __m512 inv = _mm512_set1_ps(inverse_scale);
  const __m512 top = _mm512_set1_ps(2147483520.0f);  // the largest float below 2^31
  const __m512i zp = _mm512_set1_epi32(zero_point), lo = _mm512_set1_epi32(lowest), hi = _mm512_set1_epi32(highest);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(codes(_mm512_loadu_ps(x + i), inv, top, zp, lo, hi)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_cvtepi32_storeu_epi8(out + i, m, codes(_mm512_maskz_loadu_ps(m, x + i), inv, top, zp, lo, hi));
  }
}

bool fits(const at::Tensor& x, c10::ScalarType dtype) {
  return own_quantize_runs() && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.layout() == c10::kStrided &&
         x.is_contiguous() && !x.requires_grad() && x.numel() >= kOwnQuantizeMinElements &&
         (dtype == c10::kQUInt8 || dtype == c10::kQInt8);
}

at::Tensor codes_of(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype);

at::Tensor quantized(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype) {
  const bool u8 = dtype == c10::kQUInt8;
  if (!fits(x, dtype) || !(scale > 0) || zero_point < (u8 ? 0 : -128) || zero_point > (u8 ? 255 : 127))
    return at::quantize_per_tensor(x, scale, zero_point, dtype);  // and its own errors
  // The kernel, or PyTorch's (choice site quantize_per_tensor): the same codes.
  static choices::Chooser<at::Tensor> chooser("quantize_per_tensor");
  const choices::Key key{choices::bucket(x.numel()), u8};
  auto describe = [&] { return std::pair{std::string("llga::quantize_per_tensor"), c10::str(x.sizes(), " Float")}; };
  return chooser.run(key, describe, [&](size_t i) {
    return i == 0 ? codes_of(x, scale, zero_point, dtype) : at::quantize_per_tensor(x, scale, zero_point, dtype);
  });
}

at::Tensor codes_of(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype) {
  const bool u8 = dtype == c10::kQUInt8;
  at::Tensor out = new_quantized_output(x.sizes(), dtype, scale, zero_point, c10::MemoryFormat::Contiguous);
  const float* src = x.const_data_ptr<float>();
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const float inverse_scale = 1.0f / static_cast<float>(scale);
  const auto z = static_cast<int32_t>(zero_point);
  at::parallel_for(0, x.numel(), kOwnQuantizeMinElements, [&](int64_t begin, int64_t end) {
    quantize_avx512(src + begin, dst + begin, end - begin, inverse_scale, z, u8 ? 0 : -128, u8 ? 255 : 127);
  });
  return out;
}

torch::jit::RegisterOperators registered({quantizing_operator<quantized>("quantize_per_tensor")});

}  // namespace

bool own_quantize_runs() { return cpu_features().avx512; }

}  // namespace llga
