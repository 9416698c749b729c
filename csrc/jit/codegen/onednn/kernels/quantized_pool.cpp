// llga::quantized_global_avg_pool and llga::quantized_max_pool2d (quantized_pool.h).
//
// The average: each channel's mean is its codes' sum, exact in int32, less the zero points, times
// the scale, over the pixels: the mean PyTorch computes from the dequantized values (which sums
// rounded floats: its codes and these differ at most by one, at a rounding tie), quantized as
// PyTorch quantizes (quantize.cpp).
//
// The maximum: on the input's grid, the largest code of each window, 64 channels a register;
// padding is no value (PyTorch pads with -inf), so the window is clipped to the image.
#include "jit/codegen/onednn/kernels/quantized_pool.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/kernels/quantizing_op.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/cpu_features.h"
#include "onednn/pooled_qtensor.h"

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

auto describer(const char* op, const at::Tensor& x) {
  return [op, &x] { return std::pair{std::string(op), c10::str(x.sizes(), " ", x.scalar_type())}; };
}

at::Tensor average_codes(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype);

at::Tensor pooled(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype) {
  const bool u8 = dtype == c10::kQUInt8;
  const bool fits = own_quantized_pool_runs() && x.is_quantized() && !is_llga_tensor(x) && x.device().is_cpu() && x.dim() == 4 &&
                    x.qscheme() == c10::kPerTensorAffine && (x.scalar_type() == c10::kQUInt8 || x.scalar_type() == c10::kQInt8) &&
                    x.is_contiguous(c10::MemoryFormat::ChannelsLast) && x.size(2) * x.size(3) > 0 &&
                    x.size(2) * x.size(3) <= (1 << 16) && (u8 || dtype == c10::kQInt8) && scale > 0 &&
                    zero_point >= (u8 ? 0 : -128) && zero_point <= (u8 ? 255 : 127);
  auto eager = [&] { return at::quantize_per_tensor(at::adaptive_avg_pool2d(at::dequantize(x), {1, 1}), scale, zero_point, dtype); };
  if (!fits) return eager();  // and PyTorch's own errors
  // The kernel, or PyTorch's dequantize, pool, quantize (choice site quantized_pool).
  static choices::Chooser<at::Tensor> chooser("quantized_pool");
  const choices::Key key{0, x.size(0), x.size(1), x.size(2), x.size(3), x.scalar_type() == c10::kQUInt8, u8};
  return chooser.run(key, describer("llga::quantized_global_avg_pool", x), [&](size_t i) {
    return i == 0 ? average_codes(x, scale, zero_point, dtype) : eager();
  });
}

at::Tensor average_codes(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype) {
  const bool u8 = dtype == c10::kQUInt8;
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

// One output row (n, oh) of a max pool over channels-last codes: each output pixel's maxima.
template <bool kUnsigned>
[[gnu::target("avx512f,avx512bw,avx512vl")]] void max_pool_row(const uint8_t* image, uint8_t* out, int64_t oh, int64_t height,
                                                               int64_t width, int64_t channels, int64_t out_width,
                                                               const int64_t* kernel, const int64_t* stride, const int64_t* padding) {
  const int64_t h0 = std::max<int64_t>(oh * stride[0] - padding[0], 0);
  const int64_t h1 = std::min(oh * stride[0] - padding[0] + kernel[0], height);
  for (int64_t ow = 0; ow < out_width; ++ow) {
    const int64_t w0 = std::max<int64_t>(ow * stride[1] - padding[1], 0);
    const int64_t w1 = std::min(ow * stride[1] - padding[1] + kernel[1], width);
    for (int64_t c = 0; c < channels; c += 64) {
      const __mmask64 m = channels - c >= 64 ? ~__mmask64(0) : (__mmask64(1) << (channels - c)) - 1;
      __m512i best = kUnsigned ? _mm512_setzero_si512() : _mm512_set1_epi8(-128);
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) {
          __m512i v = _mm512_maskz_loadu_epi8(m, image + (h * width + w) * channels + c);
          best = kUnsigned ? _mm512_max_epu8(best, v) : _mm512_max_epi8(best, v);
        }
      _mm512_mask_storeu_epi8(out + ow * channels + c, m, best);
    }
  }
}

// A pair from a max pool's int[2] argument (one value for both dims; stride's empty: the kernel's).
bool pair_of(const std::vector<int64_t>& v, const std::vector<int64_t>& otherwise, int64_t out[2]) {
  const std::vector<int64_t>& p = v.empty() ? otherwise : v;
  if (p.size() != 1 && p.size() != 2) return false;
  out[0] = p[0], out[1] = p.back();
  return true;
}

at::Tensor max_codes(const at::Tensor& x, const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2], double scale,
                     int64_t zero_point, c10::ScalarType dtype);

at::Tensor max_pooled(const at::Tensor& x, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride_arg,
                      const std::vector<int64_t>& padding_arg, const std::vector<int64_t>& dilation, bool ceil_mode, double scale,
                      int64_t zero_point, c10::ScalarType dtype) {
  int64_t kernel[2], stride[2], padding[2];
  const bool fits = own_quantized_pool_runs() && x.is_quantized() && !is_llga_tensor(x) && x.device().is_cpu() && x.dim() == 4 &&
                    x.qscheme() == c10::kPerTensorAffine && (x.scalar_type() == c10::kQUInt8 || x.scalar_type() == c10::kQInt8) &&
                    x.is_contiguous(c10::MemoryFormat::ChannelsLast) && dtype == x.scalar_type() && scale == x.q_scale() &&
                    zero_point == x.q_zero_point() && !ceil_mode &&
                    std::all_of(dilation.begin(), dilation.end(), [](int64_t d) { return d == 1; }) &&
                    pair_of(kernel_size, kernel_size, kernel) && pair_of(stride_arg, kernel_size, stride) &&
                    pair_of(padding_arg, {0}, padding) && kernel[0] > 0 && kernel[1] > 0 && stride[0] > 0 && stride[1] > 0 &&
                    padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1] &&
                    x.size(2) + 2 * padding[0] >= kernel[0] && x.size(3) + 2 * padding[1] >= kernel[1];
  auto eager = [&] {
    return at::quantize_per_tensor(at::max_pool2d(at::dequantize(x), kernel_size, stride_arg, padding_arg, dilation, ceil_mode),
                                   scale, zero_point, dtype);
  };
  if (!fits) return eager();  // and PyTorch's own errors
  static choices::Chooser<at::Tensor> chooser("quantized_pool");
  const choices::Key key{1, x.size(0), x.size(1), x.size(2), x.size(3), kernel[0] * 1000 + kernel[1], stride[0] * 1000 + stride[1],
                         padding[0] * 1000 + padding[1]};
  return chooser.run(key, describer("llga::quantized_max_pool2d", x), [&](size_t i) {
    return i == 0 ? max_codes(x, kernel, stride, padding, scale, zero_point, dtype) : eager();
  });
}

at::Tensor max_codes(const at::Tensor& x, const int64_t kernel[2], const int64_t stride[2], const int64_t padding[2], double scale,
                     int64_t zero_point, c10::ScalarType dtype) {
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t out_height = (height + 2 * padding[0] - kernel[0]) / stride[0] + 1;
  const int64_t out_width = (width + 2 * padding[1] - kernel[1]) / stride[1] + 1;
  at::Tensor out = new_quantized_output({batch, channels, out_height, out_width}, dtype, scale, zero_point,
                                        c10::MemoryFormat::ChannelsLast);
  const auto* src = static_cast<const uint8_t*>(x.const_data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  auto row = x.scalar_type() == c10::kQUInt8 ? max_pool_row<true> : max_pool_row<false>;
  at::parallel_for(0, batch * out_height, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / out_height, oh = r % out_height;
      row(src + n * height * width * channels, dst + r * out_width * channels, oh, height, width, channels, out_width, kernel,
          stride, padding);
    }
  });
  return out;
}

torch::jit::RegisterOperators registered({
    quantizing_operator<pooled>("quantized_global_avg_pool"),
    torch::jit::Operator(
        "llga::quantized_max_pool2d(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode, "
        "float scale, int zero_point, ScalarType dtype) -> Tensor",
        [](torch::jit::Stack& stack) {
          RECORD_FUNCTION("llga::quantized_max_pool2d", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
          auto dtype = static_cast<c10::ScalarType>(torch::jit::pop(stack).toInt());
          int64_t zero_point = torch::jit::pop(stack).toInt();
          double scale = torch::jit::pop(stack).toDouble();
          bool ceil_mode = torch::jit::pop(stack).toBool();
          std::vector<int64_t> dilation = torch::jit::pop(stack).toIntVector();
          std::vector<int64_t> padding = torch::jit::pop(stack).toIntVector();
          std::vector<int64_t> stride = torch::jit::pop(stack).toIntVector();
          std::vector<int64_t> kernel_size = torch::jit::pop(stack).toIntVector();
          at::Tensor x = torch::jit::pop(stack).toTensor();
          torch::jit::push(stack, max_pooled(x, kernel_size, stride, padding, dilation, ceil_mode, scale, zero_point, dtype));
        },
        c10::AliasAnalysisKind::FROM_SCHEMA),
});

}  // namespace

bool own_quantized_pool_runs() { return cpu_features().avx512; }

}  // namespace llga
