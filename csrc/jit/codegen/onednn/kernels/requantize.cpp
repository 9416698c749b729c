// llga::requantize (requantize.h). A code c of x (scale s, zero point z) dequantizes, as PyTorch's
// dequantize does, to float(c - z) * s; that quantizes as PyTorch's quantize does (quantize.cpp):
// clamp(round_half_even(min(v * (1 / scale), 2^31 - 128)) + zero_point). x has at most 256 codes:
// each one's new code is computed once, into a table the values are looked up in.
#include "jit/codegen/onednn/kernels/requantize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/kernels/quantizing_op.h"
#include "onednn/pooled_qtensor.h"

namespace llga {

namespace {

bool is_int8(c10::ScalarType t) { return t == c10::kQUInt8 || t == c10::kQInt8; }

at::Tensor requantized(const at::Tensor& x, double scale, int64_t zero_point, c10::ScalarType dtype) {
  const bool u8 = dtype == c10::kQUInt8;
  if (!x.is_quantized() || is_llga_tensor(x) || !x.device().is_cpu() || x.qscheme() != c10::kPerTensorAffine ||
      !is_int8(x.scalar_type()) || !is_int8(dtype) || !x.is_contiguous() || !(scale > 0) ||
      zero_point < (u8 ? 0 : -128) || zero_point > (u8 ? 255 : 127))
    return at::quantize_per_tensor(at::dequantize(x), scale, zero_point, dtype);  // and its own errors
  const bool from_u8 = x.scalar_type() == c10::kQUInt8;
  const auto from_scale = static_cast<float>(x.q_scale());
  const auto from_zero_point = static_cast<int32_t>(x.q_zero_point());
  const float inverse_scale = 1.0f / static_cast<float>(scale);
  const auto z = static_cast<int32_t>(zero_point);
  const int32_t lowest = u8 ? 0 : -128, highest = u8 ? 255 : 127;
  std::array<uint8_t, 256> table;  // by the code's byte
  for (int32_t code = from_u8 ? 0 : -128; code <= (from_u8 ? 255 : 127); ++code) {
    const float v = static_cast<float>(code - from_zero_point) * from_scale;
    const auto r = static_cast<int32_t>(std::nearbyint(std::min(v * inverse_scale, 2147483520.0f)));
    table[static_cast<uint8_t>(code)] = static_cast<uint8_t>(std::clamp(static_cast<int32_t>(static_cast<uint32_t>(r) + static_cast<uint32_t>(z)), lowest, highest));
  }
  at::Tensor out = new_quantized_output(x.sizes(), dtype, scale, zero_point, c10::MemoryFormat::Contiguous);
  const auto* src = static_cast<const uint8_t*>(x.const_data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t i = 0, n = x.numel(); i < n; ++i) dst[i] = table[src[i]];
  return out;
}

torch::jit::RegisterOperators registered({quantizing_operator<requantized>("requantize")});

}  // namespace

}  // namespace llga
