#pragma once
// Pools of int8 codes, codes out, where oneDNN Graph would run a partition of their own; the
// QuantizedPoolOwnKernel pass gives them their patterns.
//
// llga::quantized_global_avg_pool(x, scale, zero_point, dtype): quantize_per_tensor(
// adaptive_avg_pool2d(dequantize(x), [1, 1]), scale, zero_point, dtype) of a dense channels-last
// per-tensor u8/s8 tensor, AVX-512, one thread. A CNN's pool before its classifier: oneDNN Graph
// runs it as a partition of its own, 12-15 us on MobileNetV2's 7x7x1280 codes, where the sums
// take about 1.
//
// llga::quantized_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, scale,
// zero_point, dtype): quantize_per_tensor(max_pool2d(dequantize(x), ...), scale, zero_point, dtype).
// On the input's own grid (PT2E's max pool shares its input's scale and zero point) the largest
// code is the code of the largest value: exact. ResNet-50's stem pool (112x112x64 codes) took
// oneDNN Graph 98 us (its kernel 66), the codes' maxima take a few.
#include <ATen/core/symbol.h>

namespace llga {

inline const c10::Symbol kQuantizedGlobalAvgPool = c10::Symbol::fromQualString("llga::quantized_global_avg_pool");
inline const c10::Symbol kQuantizedMaxPool2d = c10::Symbol::fromQualString("llga::quantized_max_pool2d");

// Whether this CPU runs the kernels (AVX-512 F, BW and VL).
bool own_quantized_pool_runs();

}  // namespace llga
