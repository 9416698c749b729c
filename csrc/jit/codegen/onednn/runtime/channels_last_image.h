#pragma once
// A model's NCHW input image of 1-4 channels, interleaved to NHWC before oneDNN reads it.
#include <ATen/Tensor.h>

namespace llga {

// t in channels-last, when t is a contiguous fp32 or bf16 NCHW image of 1-4 channels; else t.
at::Tensor image_to_channels_last(const at::Tensor& t);

}  // namespace llga
