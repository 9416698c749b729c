#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"

#include <typeinfo>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include "onednn/buffer_pool.h"

namespace llga {

LlgaTensorImpl::LlgaTensorImpl(c10::Storage&& storage, const caffe2::TypeMeta& dtype,
                               const dnnl::graph::logical_tensor& desc)
    : c10::TensorImpl(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::MkldnnCPU), dtype),
      desc_(desc),
      layout_strides_(desc.get_layout_type() == dnnl::graph::logical_tensor::layout_type::strided ? desc.get_strides()
                                                                                                   : std::vector<int64_t>{}) {
  set_sizes_contiguous(desc.get_dims());
}

at::Tensor empty_llga(const dnnl::graph::logical_tensor& desc, c10::ScalarType dtype) {
  size_t nbytes = desc.get_mem_size();
  // From oneDNN's buffer pool: a group's output is freed when the next group has read it, and the
  // same sizes come back on every call (fresh memory would cost a page fault per page each time).
  void* p = nbytes ? onednn::allocate_buffer(nbytes, 64) : nullptr;
  TORCH_CHECK(p || !nbytes, "torch_llga: out of memory allocating ", nbytes, " bytes");
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(p, p, &onednn::free_buffer, c10::Device(c10::kCPU)), nullptr, /*resizable=*/false);
  return at::detail::make_tensor<LlgaTensorImpl>(std::move(storage), c10::scalarTypeToTypeMeta(dtype), desc);
}

bool is_llga_tensor(const at::Tensor& t) {
  // The dispatch key first: a cheap test that rejects every ordinary tensor (it runs several times
  // per group input per call); PyTorch's own mkldnn tensors share the key, hence the exact type
  // (a typeid compare: equal type_info objects here; a dynamic_cast walked the class hierarchy
  // comparing type names, ~800 instructions a group input per call in callgrind).
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::MkldnnCPU) &&
         typeid(*t.unsafeGetTensorImpl()) == typeid(LlgaTensorImpl);
}

const LlgaTensorImpl& llga_impl(const at::Tensor& t) {
  return *static_cast<const LlgaTensorImpl*>(t.unsafeGetTensorImpl());
}

}  // namespace llga
