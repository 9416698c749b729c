#pragma once
// A model's NCHW input image of 1-4 channels, interleaved to NHWC before oneDNN reads it.
#include <ATen/Tensor.h>

namespace llga {

// t in channels-last, when t is a contiguous fp32 or bf16 NCHW image of 1-4 channels; else t.
at::Tensor image_to_channels_last(const at::Tensor& t);

// A contiguous 3-D, 4-D or 5-D tensor (not an LLGA one) copied to channels-last (nwc, nhwc, ndhwc), the
// layout oneDNN's fast 1-D/3-D pooling kernels read (quirks::pooling_reads_channels_last); others as they are.
at::Tensor plain_to_channels_last(const at::Tensor& t);

}  // namespace llga
