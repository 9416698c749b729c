// Quantized tensors over the buffer pool's memory (pooled_qtensor.h).
#include "onednn/pooled_qtensor.h"

#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/Allocator.h>
#include <c10/util/accumulate.h>

#include "onednn/buffer_pool.h"

namespace llga {

namespace {

// The buffer pool as PyTorch allocator: a storage from it resizes as one from the CPU allocator.
struct PoolAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? onednn::allocate_buffer(nbytes, 64) : nullptr;
    TORCH_CHECK(p || !nbytes, "torch_llga: out of memory allocating ", nbytes, " bytes");
    return {p, p, &onednn::free_buffer, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &onednn::free_buffer; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

c10::Allocator* pool_allocator() {
  static PoolAllocator allocator;
  return &allocator;
}

// A CPU QTensor of these sizes in format over `storage`, with this scale and zero point.
at::Tensor qtensor_on(c10::Storage storage, c10::IntArrayRef sizes, c10::ScalarType dtype, double scale, int64_t zero_point,
                      c10::MemoryFormat format) {
  auto out = at::detail::make_tensor<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::QuantizedCPU),
                                                       c10::scalarTypeToTypeMeta(dtype),
                                                       at::make_per_tensor_affine_quantizer(scale, zero_point, dtype));
  out.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  out.unsafeGetTensorImpl()->empty_tensor_restride(format);
  return out;
}

}  // namespace

// The buffer pool hands the same buffers back call after call: no malloc of an activation's size
// (glibc's search of its large bins) and memory still warm in the caches.
at::Tensor new_quantized_output(c10::IntArrayRef sizes, c10::ScalarType dtype, double scale, int64_t zero_point,
                                c10::MemoryFormat format) {
  size_t nbytes = c10::elementSize(dtype) * static_cast<size_t>(c10::multiply_integers(sizes));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, pool_allocator(), /*resizable=*/true);
  return qtensor_on(std::move(storage), sizes, dtype, scale, zero_point, format);
}

// The strides are the format's, as the output allocated apart would have them (t's may differ
// where a dim is 1); the dispatch keys at::new_qtensor gives a CPU quantized tensor.
at::Tensor quantized_output_in(const at::Tensor& t, double scale, int64_t zero_point, c10::MemoryFormat format) {
  return qtensor_on(c10::Storage(t.storage()), t.sizes(), t.scalar_type(), scale, zero_point, format);
}

}  // namespace llga
