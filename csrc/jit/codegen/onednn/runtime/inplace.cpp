// The in-place rule: when a fused output may be computed in an input's memory (oneDNN reports
// the pair; a residual add accumulates into the added tensor) without anyone else seeing that
// memory change. Decided by reference counts, on every call, for the pairs the compile kept.
#include "jit/codegen/onednn/runtime/inplace.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/accumulate.h>
#include <atomic>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/dtypes.h"
#include "onednn/buffer_pool.h"
#include "onednn/pooled_qtensor.h"

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

}  // namespace llga
