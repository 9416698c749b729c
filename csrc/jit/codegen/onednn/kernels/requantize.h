#pragma once
// llga::requantize(x, scale, zero_point, dtype): aten::quantize_per_tensor(aten::dequantize(x), scale,
// zero_point, dtype) of a dense per-tensor u8/s8 tensor, bit for bit, in one pass over its codes.
// prepare_quantization.cpp gives it a reshape between two grids: PT2E's classifier head
// (flatten -> dropout -> linear) dequantizes the pool's codes, flattens them and quantizes them
// again to the linear's own scale, three PyTorch ops between two int8 groups.
#include <ATen/core/symbol.h>

namespace llga {

inline const c10::Symbol kRequantize = c10::Symbol::fromQualString("llga::requantize");

}  // namespace llga
