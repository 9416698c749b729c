// StateSnapshot: what the torch.compile and export doors baked into a script as constants (a
// model's parameters and buffers), to tell on each call whether the caller's arguments still hold
// it. Python binding only (init.cpp).
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
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
      entries_.push_back({position, item, t.unsafeGetTensorImpl(), t._version(), data_of(t.unsafeGetTensorImpl())});
    }
  }

  // Does `args` hold the same objects at the positions, none written in place and none given other
  // memory (`p.data = t` keeps the version) since? After a model's run the weights' tensor objects
  // are out of cache: identities are read from the argument list alone, and the impls are
  // prefetched for all before any is read, so that their misses overlap.
  bool holds(const pybind11::sequence& args) const {
    pybind11::object fast = pybind11::reinterpret_steal<pybind11::object>(PySequence_Fast(args.ptr(), "a sequence"));
    if (!fast) throw pybind11::error_already_set();
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(fast.ptr());
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    for (const Entry& e : entries_) {
      if (e.position >= size || items[e.position] != e.object.ptr()) return false;
      __builtin_prefetch(e.impl);
    }
    for (const Entry& e : entries_) {
      if (e.impl->version_counter().current_version() != e.version || data_of(e.impl) != e.data) return false;
    }
    return true;
  }

 private:
  // Where the tensor's values live: its storage and offset, read from the impl itself (another
  // memory, `p.data = t`, shows as another storage).
  static std::pair<const void*, int64_t> data_of(const c10::TensorImpl* impl) {
    return {impl->has_storage() ? impl->unsafe_storage().unsafeGetStorageImpl() : nullptr, impl->storage_offset()};
  }

  struct Entry {
    int64_t position;
    pybind11::object object;  // held: its identity stays this tensor's
    c10::TensorImpl* impl;
    int64_t version;
    std::pair<const void*, int64_t> data;
  };
  std::vector<Entry> entries_;
};

}  // namespace llga
