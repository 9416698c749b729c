#pragma once
// A tensor whose memory is in a oneDNN Graph layout (possibly opaque, e.g. a blocked layout chosen
// by a compiled partition). It travels only between llga::FusionGroup nodes so a blocked layout
// is not reordered back to strided at every group boundary. It uses the MkldnnCPU dispatch key:
// an aten op that is handed one by mistake fails loudly instead of reading blocked memory as strided.
#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

namespace llga {

class LlgaTensorImpl final : public c10::TensorImpl {
 public:
  LlgaTensorImpl(c10::Storage&& storage, const caffe2::TypeMeta& dtype,
                 const dnnl::graph::logical_tensor& desc);

  // The layout of the memory: dims, data type and the layout (strided or opaque layout id).
  const dnnl::graph::logical_tensor& desc() const { return desc_; }
  // A strided layout's strides, read once (the kernel checks them on every call); empty if opaque.
  c10::IntArrayRef layout_strides() const { return layout_strides_; }
  void* data() const { return storage_.mutable_data(); }

  const char* tensorimpl_type_name() const override { return "llga::LlgaTensorImpl"; }

 private:
  dnnl::graph::logical_tensor desc_;
  std::vector<int64_t> layout_strides_;
};

// Allocates an LLGA tensor for an output logical tensor queried from a compiled partition.
at::Tensor empty_llga(const dnnl::graph::logical_tensor& desc, c10::ScalarType dtype);

bool is_llga_tensor(const at::Tensor& t);
const LlgaTensorImpl& llga_impl(const at::Tensor& t);

// Its strided copy for PyTorch's ops: llga_to_dense (runtime/to_dense.h), a reorder the fuser's
// runtime compiles and caches.

}  // namespace llga
