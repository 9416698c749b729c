#pragma once
// llga::quantized_global_avg_pool(x, scale, zero_point, dtype): quantize_per_tensor(
// adaptive_avg_pool2d(dequantize(x), [1, 1]), scale, zero_point, dtype) of a dense channels-last
// per-tensor u8/s8 tensor, AVX-512, one thread. A CNN's pool before its classifier: oneDNN Graph
// runs it as a partition of its own, 12-15 us on MobileNetV2's 7x7x1280 codes, where the sums
// take about 1. The QuantizedPoolOwnKernel pass gives it that pattern.
#include <ATen/core/symbol.h>

namespace llga {

inline const c10::Symbol kQuantizedGlobalAvgPool = c10::Symbol::fromQualString("llga::quantized_global_avg_pool");

// Whether this CPU runs the kernel (AVX-512 F, BW and VL).
bool own_quantized_pool_runs();

}  // namespace llga
