// The in-place rule: when a fused output may be computed in an input's memory (oneDNN reports
// the pair; a residual add accumulates into the added tensor) without anyone else seeing that
// memory change. Decided by reference counts, on every call, for the pairs the compile kept.
#include "jit/codegen/onednn/runtime/inplace.h"

#include <atomic>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"

namespace llga {

using dnnl::graph::logical_tensor;

// Whether input t (from stack slot arg) may become output lt, computed in its memory: t is an LLGA
// tensor (memory this library allocated: a dense tensor from elsewhere may share its buffer beyond
// what the counts show, as a copy-on-write clone or a file mapping does) in lt's very layout, and
// nothing but this call holds it. The references expected are the call's (`inputs`), the stack
// slot's and, for a guard's output, the interpreter's register for it (see kGuardedInputs); any
// other (a register of a value read later, a forked task, a view of the storage, a weak reference)
// makes it shared.
bool reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const logical_tensor& lt) {
  if (!is_llga_tensor(t) || !arg.isTensor() || arg.unsafeToTensorImpl() != t.unsafeGetTensorImpl()) return false;
  const auto& d = llga_impl(t).desc();
  bool same_layout = d.get_data_type() == lt.get_data_type() && d.get_dims() == lt.get_dims() &&
                     d.get_layout_type() == lt.get_layout_type() &&
                     (lt.get_layout_type() == logical_tensor::layout_type::opaque ? d.get_layout_id() == lt.get_layout_id()
                                                                                 : d.get_strides() == lt.get_strides());
  bool sole = t.use_count() == static_cast<size_t>(2 + guarded) && t.weak_use_count() == 1 && t.storage().use_count() == 1;
  // Writes below must follow the release of the other references (a forked task's, say).
  std::atomic_thread_fence(std::memory_order_acquire);
  return same_layout && sole;
}

}  // namespace llga
