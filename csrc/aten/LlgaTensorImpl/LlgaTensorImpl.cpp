#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"

#include <typeinfo>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include "jit/codegen/onednn/runtime/runtime.h"

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
  void* p = nbytes ? runtime::allocate_buffer(nbytes, 64) : nullptr;
  TORCH_CHECK(p || !nbytes, "torch_llga: out of memory allocating ", nbytes, " bytes");
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(p, p, &runtime::free_buffer, c10::Device(c10::kCPU)), nullptr, /*resizable=*/false);
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

at::Tensor llga_to_dense(const at::Tensor& t) {
  if (!is_llga_tensor(t)) return t;
  const auto& impl = llga_impl(t);
  const auto& src = impl.desc();
  auto dims = src.get_dims();
  at::Tensor out = at::empty(dims, at::TensorOptions().dtype(t.scalar_type()));
  if (out.numel() == 0) return out;
  // A one-op graph: Reorder from the opaque layout to plain strided.
  using dnnl::graph::logical_tensor;
  logical_tensor in_lt = src.get_layout_type() == logical_tensor::layout_type::opaque
                            ? logical_tensor(0, src.get_data_type(), dims, src.get_layout_id())
                            : logical_tensor(0, src.get_data_type(), dims, src.get_strides());
  logical_tensor out_lt(1, src.get_data_type(), dims, out.strides().vec());
  dnnl::graph::op reorder(0, dnnl::graph::op::kind::Reorder, {in_lt}, {out_lt}, "to_dense");
  dnnl::graph::graph g(dnnl::engine::kind::cpu);
  g.add_op(reorder);
  g.finalize();
  auto parts = g.get_partitions();
  TORCH_CHECK(parts.size() == 1 && parts[0].is_supported(), "torch_llga: cannot reorder an LLGA tensor to strided");
  auto cp = parts[0].compile({in_lt}, {out_lt}, runtime::engine());
  dnnl::graph::tensor in(in_lt, runtime::engine(), impl.data());
  dnnl::graph::tensor o(out_lt, runtime::engine(), out.data_ptr());
  cp.execute(runtime::stream(), {in}, {o});
  return out;
}

}  // namespace llga
