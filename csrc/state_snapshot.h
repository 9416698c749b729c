// StateSnapshot: what the torch.compile and export doors baked into a script as constants (a
// model's parameters and buffers), to tell on each call whether the caller's arguments still hold
// it. Python binding only (init.cpp).
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace llga {

class StateSnapshot {
 public:
  // The tensors at `positions` of `args` (a list or tuple). Raises for a tensor without a version
  // counter (an inference tensor), as reading _version does.
  StateSnapshot(const pybind11::sequence& args, const std::vector<int64_t>& positions) {
    for (int64_t position : positions) {
      pybind11::object item = args[position];
      if (!THPVariable_Check(item.ptr())) throw pybind11::type_error("StateSnapshot takes tensors");
      const at::Tensor& t = THPVariable_Unpack(item.ptr());
      c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      entries_.push_back({position, item, impl, counter_of(impl), t._version(), data_of(impl)});
    }
  }

  // Does `args` hold the same objects at the positions, none written in place and none given other
  // memory (`p.data = t` keeps the version) since? After a model's run the weights' tensor objects
  // are out of cache, each read a miss (MobileNetV2's 265 in turn: 31 us a call). All the lines
  // read are prefetched first, the version counters' too (their addresses recorded), so that the
  // misses overlap.
  bool holds(const pybind11::sequence& args) const {
    pybind11::object fast = pybind11::reinterpret_steal<pybind11::object>(PySequence_Fast(args.ptr(), "a sequence"));
    if (!fast) throw pybind11::error_already_set();
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(fast.ptr());
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    for (const Entry& e : entries_) {
      if (e.position >= size || items[e.position] != e.object.ptr()) return false;
      __builtin_prefetch(e.object.ptr());
      const auto first = reinterpret_cast<uintptr_t>(e.impl) & ~uintptr_t(63);
      for (uintptr_t line = first; line < reinterpret_cast<uintptr_t>(e.impl) + sizeof(c10::TensorImpl); line += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(line));
      __builtin_prefetch(e.counter);
    }
    for (const Entry& e : entries_) {
      // The same impl under the object (torch.utils.swap_tensors gives it another; only then is
      // e.impl read, which the object keeps alive), its version counter, version and memory.
      if (THPVariable_Unpack(e.object.ptr()).unsafeGetTensorImpl() != e.impl || counter_of(e.impl) != e.counter ||
          e.impl->version_counter().current_version() != e.version || data_of(e.impl) != e.data)
        return false;
    }
    return true;
  }

 private:
  // Where the tensor's values live: its storage and offset, read from the impl itself (another
  // memory, `p.data = t`, shows as another storage).
  static std::pair<const void*, int64_t> data_of(const c10::TensorImpl* impl) {
    return {impl->has_storage() ? impl->unsafe_storage().unsafeGetStorageImpl() : nullptr, impl->storage_offset()};
  }

  // The version counter's own object (a VariableVersion is one pointer to it, shared by the tensor's
  // views), for its prefetch and to tell another counter.
  static const void* counter_of(const c10::TensorImpl* impl) {
    static_assert(sizeof(c10::VariableVersion) == sizeof(void*), "a VariableVersion is one intrusive_ptr");
    const void* counter;
    std::memcpy(&counter, &impl->version_counter(), sizeof(counter));
    return counter;
  }

  struct Entry {
    int64_t position;
    pybind11::object object;  // held: its identity stays this tensor's
    c10::TensorImpl* impl;
    const void* counter;
    int64_t version;
    std::pair<const void*, int64_t> data;
  };
  std::vector<Entry> entries_;
};

}  // namespace llga
