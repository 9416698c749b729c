// The Python module torch_llga._C. Loading it registers the pass pipeline and the operators
// (static registrations in pipeline.cpp and kernel.cpp); these functions only flip the switch.
#include <pybind11/pybind11.h>
#include <oneapi/dnnl/dnnl_graph.hpp>
#include <oneapi/dnnl/dnnl_version.h>

#include "jit/codegen/onednn/runtime.h"

PYBIND11_MODULE(_C, m) {
  m.def("_set_enabled", &llga::runtime::set_enabled);
  m.def("_is_enabled", &llga::runtime::enabled);
  m.def("_set_fuse_all_partitions", &llga::runtime::set_fuse_all_partitions);
  m.def("_constant_cache_enabled", [] { return dnnl::graph::get_constant_tensor_cache() != 0; });
  m.def("_stats", [] {
    auto& s = llga::runtime::stats();
    pybind11::dict d;
    d["executions"] = s.executions.load();
    d["compilations"] = s.compilations.load();
    d["guard_failures"] = s.guard_failures.load();
    d["kernel_fallbacks"] = s.kernel_fallbacks.load();
    return d;
  });
  m.def("_onednn_version", [] {
    return std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR) + "." +
           std::to_string(DNNL_VERSION_PATCH);
  });
}
