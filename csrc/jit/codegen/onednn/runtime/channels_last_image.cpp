// A model's input image, NCHW with 1-4 channels, interleaved to NHWC before oneDNN reads it
// (image_to_channels_last says why), with loops the compiler vectorizes for AVX-512 and AVX2.
#include "jit/codegen/onednn/runtime/channels_last_image.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/strides.h>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/dtypes.h"
#include "jit/codegen/onednn/runtime/inplace.h"
#include "onednn/pooled_qtensor.h"
#include "jit/codegen/onednn/runtime/to_dense.h"
#include "onednn/buffer_pool.h"

namespace llga {

namespace {

// An image's planes interleaved: NCHW to NHWC, C (1-4) known at compile time so that the
// interleaving stores vectorize.
template <typename T, int C>
[[gnu::target_clones("avx512f", "avx2", "default"), gnu::optimize("O3")]] void interleave_planes(const T* __restrict in, T* __restrict out,
                                                                                               int64_t plane, int64_t begin, int64_t end) {
  const T* __restrict planes[C];
  for (int c = 0; c < C; ++c) planes[c] = in + c * plane;
  for (int64_t p = begin; p < end; ++p)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[p * C + c] = planes[c][p];
}

template <typename T>
void interleave(const T* in, T* out, int64_t n, int64_t c, int64_t plane) {
  for (int64_t i = 0; i < n; ++i) {
    const T* src = in + i * c * plane;
    T* dst = out + i * c * plane;
    at::parallel_for(0, plane, 16 * 1024, [&](int64_t begin, int64_t end) {
      switch (c) {
        case 1: return interleave_planes<T, 1>(src, dst, plane, begin, end);
        case 2: return interleave_planes<T, 2>(src, dst, plane, begin, end);
        case 3: return interleave_planes<T, 3>(src, dst, plane, begin, end);
        default: return interleave_planes<T, 4>(src, dst, plane, begin, end);
      }
    });
  }
}

}  // namespace

// A contiguous NCHW image of 1-4 channels (a model's input) that only convolutions read goes to
// oneDNN channels-last: oneDNN reorders it so inside the partition anyway, and slowly at so few
// channels (60 us for 1x3x224x224 in ONEDNN_VERBOSE). A MobileNetV2-like stem, conv + depthwise
// conv + pool: 133 us a call before, 117 after (AMD EPYC Zen 5, 2 threads). Other tensors (LLGA
// ones too: a group's output is already in the layout oneDNN chose) are returned as they are.
// An int8 model's quantized image likewise (1x3x224x224 u8: 30 us in oneDNN's reorder).
at::Tensor image_to_channels_last(const at::Tensor& t) {
  if (!t.defined() || is_llga_tensor(t) || t.dim() != 4 || t.size(1) > 4 || t.numel() == 0 || !t.is_contiguous() ||
      t.is_contiguous(at::MemoryFormat::ChannelsLast))
    return t;
  if (t.is_quantized()) {
    if (t.qscheme() != at::kPerTensorAffine || t.element_size() != 1) return t;
    at::Tensor out = new_quantized_output(t.sizes(), t.scalar_type(), t.q_scale(), t.q_zero_point(), at::MemoryFormat::ChannelsLast);
    interleave(static_cast<const uint8_t*>(t.const_data_ptr()), static_cast<uint8_t*>(out.data_ptr()), t.size(0), t.size(1),
               t.size(2) * t.size(3));
    return out;
  }
  const DtypeTraits* dtype = dtype_traits(t.scalar_type());
  if (!dtype || !dtype->floating || (t.element_size() != 4 && t.element_size() != 2)) return t;
  // From the buffer pool: the same size comes back on every call (fresh memory: a fault per page).
  const size_t nbytes = t.nbytes();
  void* p = onednn::allocate_buffer(nbytes, 64);
  TORCH_CHECK(p, "torch_llga: out of memory allocating ", nbytes, " bytes");
  at::Tensor out = at::from_blob(p, t.sizes(), c10::get_channels_last_strides_2d(t.sizes()), &onednn::free_buffer, t.options());
  const int64_t plane = t.size(2) * t.size(3);
  if (t.element_size() == 4)
    interleave(static_cast<const uint32_t*>(t.const_data_ptr()), static_cast<uint32_t*>(out.data_ptr()), t.size(0), t.size(1), plane);
  else
    interleave(static_cast<const uint16_t*>(t.const_data_ptr()), static_cast<uint16_t*>(out.data_ptr()), t.size(0), t.size(1), plane);
  return out;
}

at::Tensor plain_to_channels_last(const at::Tensor& t) {
  if (!t.defined() || is_llga_tensor(t) || t.dim() < 3 || t.dim() > 5 || !t.is_contiguous() || !to_dnnl_dtype(t.scalar_type()))
    return t;
  int64_t spatial = 1;
  for (int64_t d = 2; d < t.dim(); ++d) spatial *= t.size(d);
  if (t.size(1) == 1 || spatial == 1) return t;  // the same memory either way (and no tied strides)
  std::vector<int64_t> strides(t.dim());  // channels innermost, then the spatial dims, then the batch
  int64_t stride = t.size(1);
  strides[1] = 1;
  for (int64_t d = t.dim() - 1; d >= 2; --d) strides[d] = stride, stride *= t.size(d);
  strides[0] = stride;
  return strided_copy(t, strides);
}

}  // namespace llga
