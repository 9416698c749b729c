// llga::quantized_global_avg_pool (quantized_pool.h). Each channel's mean is its codes' sum, exact
// in int32, less the zero points, times the scale, over the pixels: the mean PyTorch computes from
// the dequantized values (which sums rounded floats: its codes and these differ at most by one, at
// a rounding tie), quantized as PyTorch quantizes (quantize.cpp).
#include "jit/codegen/onednn/kernels/quantized_pool.h"

#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/kernels/quantizing_op.h"
#include "jit/codegen/onednn/runtime/inplace.h"

namespace llga {

namespace {

// One image's pixels x channels codes (channels-last) -> its channels' codes.
template <bool kUnsigned>
[[gnu::target("avx512f,avx512bw,avx512vl")]] void pool_image(const uint8_t* x, uint8_t* out, int64_t pixels, int64_t channels, int32_t from_zero_point,
                                           float from_scale, float inverse_scale, int32_t zero_point, int32_t lowest, int32_t highest) {
  const __m512i offset = _mm512_set1_epi32(static_cast<int32_t>(pixels) * from_zero_point);
  const __m512 scale = _mm512_set1_ps(from_scale), count = _mm512_set1_ps(static_cast<float>(pixels));
  const __m512 inv = _mm512_set1_ps(inverse_scale), top = _mm512_set1_ps(2147483520.0f);
  const __m512i zp = _mm512_set1_epi32(zero_point), lo = _mm512_set1_epi32(lowest), hi = _mm512_set1_epi32(highest);
  for (int64_t c = 0; c < channels; c += 16) {
    const __mmask16 m = channels - c >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (channels - c)) - 1);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t p = 0; p < pixels; ++p) {
      __m128i codes = _mm_maskz_loadu_epi8(m, x + p * channels + c);
      sum = _mm512_add_epi32(sum, kUnsigned ? _mm512_cvtepu8_epi32(codes) : _mm512_cvtepi8_epi32(codes));
    }
    __m512 mean = _mm512_div_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset)), scale), count);
    __m512i r = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_mul_ps(mean, inv), top));
    r = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(r, zp), lo), hi);
    _mm512_mask_cvtepi32_storeu_epi8(out + c, m, r);
  }
}

at::Tensor pooled(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype) {
  const bool u8 = dtype == c10::kQUInt8;
  const bool fits = own_quantized_pool_runs() && x.is_quantized() && !is_llga_tensor(x) && x.device().is_cpu() && x.dim() == 4 &&
                    x.qscheme() == c10::kPerTensorAffine && (x.scalar_type() == c10::kQUInt8 || x.scalar_type() == c10::kQInt8) &&
                    x.is_contiguous(c10::MemoryFormat::ChannelsLast) && x.size(2) * x.size(3) > 0 &&
                    x.size(2) * x.size(3) <= (1 << 16) && (u8 || dtype == c10::kQInt8) && scale > 0 &&
                    zero_point >= (u8 ? 0 : -128) && zero_point <= (u8 ? 255 : 127);
  if (!fits)  // and PyTorch's own errors
    return at::quantize_per_tensor(at::adaptive_avg_pool2d(at::dequantize(x), {1, 1}), scale, zero_point, dtype);
  const int64_t batch = x.size(0), channels = x.size(1), pixels = x.size(2) * x.size(3);
  at::Tensor out = new_quantized_output({batch, channels, 1, 1}, dtype, scale, zero_point, c10::MemoryFormat::Contiguous);
  const auto* src = static_cast<const uint8_t*>(x.const_data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const auto from_scale = static_cast<float>(x.q_scale());
  const auto from_zero_point = static_cast<int32_t>(x.q_zero_point());
  const float inverse_scale = 1.0f / static_cast<float>(scale);
  const auto z = static_cast<int32_t>(zero_point);
  const bool from_u8 = x.scalar_type() == c10::kQUInt8;
  for (int64_t n = 0; n < batch; ++n) {
    auto image = from_u8 ? pool_image<true> : pool_image<false>;
    image(src + n * pixels * channels, dst + n * channels, pixels, channels, from_zero_point, from_scale, inverse_scale, z,
          u8 ? 0 : -128, u8 ? 255 : 127);
  }
  return out;
}

torch::jit::RegisterOperators registered({quantizing_operator<pooled>("quantized_global_avg_pool")});

}  // namespace

bool own_quantized_pool_runs() {
  static const bool runs = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return runs;
}

}  // namespace llga
