// The in-place rule: when a fused output may be computed in an input's memory (oneDNN reports
// the pair; a residual add accumulates into the added tensor) without anyone else seeing that
// memory change. Decided by reference counts, on every call, for the pairs the compile kept.
#include "jit/codegen/onednn/runtime/inplace.h"

#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/accumulate.h>
#include <atomic>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/dtypes.h"
#include "onednn/buffer_pool.h"

namespace llga {

using dnnl::graph::logical_tensor;

namespace {

// Whether t (from stack slot arg) is held by this call alone. The references expected are the
// call's (`inputs`), the stack slot's and, for a guard's output, the interpreter's register for it
// (see kGuardedInputs); any other (a register of a value read later, a forked task, a view of the
// storage, a weak reference) makes it shared.
bool sole_reference(const at::Tensor& t, const c10::IValue& arg, bool guarded) {
  bool sole = arg.isTensor() && arg.unsafeToTensorImpl() == t.unsafeGetTensorImpl() &&
              t.use_count() == static_cast<size_t>(2 + guarded) && t.weak_use_count() == 1 && t.storage().use_count() == 1;
  // Writes after this must follow the release of the other references (a forked task's, say).
  std::atomic_thread_fence(std::memory_order_acquire);
  return sole;
}

}  // namespace

// Whether input t may become output lt, computed in its memory: t is an LLGA tensor (memory this
// library allocated: a dense tensor from elsewhere may share its buffer beyond what the counts
// show, as a copy-on-write clone or a file mapping does) in lt's very layout, held by this call
// alone.
bool reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const logical_tensor& lt) {
  if (!is_llga_tensor(t)) return false;
  const auto& d = llga_impl(t).desc();
  bool same_layout = d.get_data_type() == lt.get_data_type() && d.get_dims() == lt.get_dims() &&
                     d.get_layout_type() == lt.get_layout_type() &&
                     (lt.get_layout_type() == logical_tensor::layout_type::opaque ? d.get_layout_id() == lt.get_layout_id()
                                                                                 : d.get_strides() == lt.get_strides());
  return same_layout && sole_reference(t, arg, guarded);
}

// Not an LLGA tensor, so where its memory came from stands in for "memory this library
// allocated": the buffer pool's deleter (new_quantized_output) or the CPU allocator's rules out a
// copy-on-write clone (cow's deleter), a file mapping and from_blob memory.
namespace {

bool allocated_here(const at::Tensor& t) {
  auto deleter = t.storage().data_ptr().get_deleter();
  auto cpu_deleter = c10::GetCPUAllocator()->raw_deleter();
  return deleter == &onednn::free_buffer || (cpu_deleter != nullptr && deleter == cpu_deleter);
}

}  // namespace

bool dense_reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const logical_tensor& lt) {
  if (!t.defined() || is_llga_tensor(t) || t.is_quantized() || t.layout() != c10::kStrided || !t.has_storage() ||
      t.storage_offset() != 0 || lt.get_layout_type() != logical_tensor::layout_type::strided)
    return false;
  auto dtype = to_dnnl_dtype(t.scalar_type());
  return dtype && *dtype == lt.get_data_type() && t.sizes() == c10::IntArrayRef(lt.get_dims()) &&
         t.strides() == c10::IntArrayRef(lt.get_strides()) && allocated_here(t) && sole_reference(t, arg, guarded);
}

bool quantized_reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, c10::ScalarType dtype,
                                  c10::IntArrayRef sizes, c10::MemoryFormat format) {
  if (!t.defined() || !t.is_quantized() || t.qscheme() != at::kPerTensorAffine || t.scalar_type() != dtype ||
      t.sizes() != sizes || t.storage_offset() != 0 || !t.is_contiguous(format))
    return false;
  return allocated_here(t) && sole_reference(t, arg, guarded);
}

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
