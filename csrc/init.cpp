// The Python module torch_llga._C. Loading it registers the pass pipeline and the operators
// (static registrations in pipeline.cpp and kernel.cpp); these functions only flip the switch.
#include <pybind11/pybind11.h>
#include <oneapi/dnnl/dnnl_graph.hpp>
#include <oneapi/dnnl/dnnl_version.h>

#include "jit/codegen/onednn/fusion_kernel.h"
#include "jit/codegen/onednn/runtime.h"

PYBIND11_MODULE(_C, m) {
  m.def("_set_enabled", &llga::runtime::set_enabled);
  m.def("_is_enabled", &llga::runtime::enabled);
  m.def("_set_fuse_all_partitions", &llga::runtime::set_fuse_all_partitions);
  m.def("_set_shape_policy", [](bool compile) {
    llga::runtime::set_shape_policy(compile ? llga::runtime::ShapePolicy::kCompile : llga::runtime::ShapePolicy::kFallback);
  });
  m.def("_shape_policy_is_compile", [] { return llga::runtime::shape_policy() == llga::runtime::ShapePolicy::kCompile; });
  m.def("_set_cache_capacity", &llga::runtime::set_cache_capacity);
  m.def("_cache_capacity", &llga::runtime::cache_capacity);
  m.def("_release", [](const std::shared_ptr<torch::jit::Graph>& g) { return llga::release_compiled_partitions(g.get()); });
  m.def("_release_all", [] { return llga::release_compiled_partitions(nullptr); });
  m.def("_constant_cache_enabled", [] { return dnnl::graph::get_constant_tensor_cache() != 0; });
  m.def("_stats", [] {
    auto& s = llga::runtime::stats();
    pybind11::dict d;
    d["executions"] = s.executions.load();
    d["compilations"] = s.compilations.load();
    d["guard_failures"] = s.guard_failures.load();
    d["kernel_fallbacks"] = s.kernel_fallbacks.load();
    d["nonfinite_fallbacks"] = s.nonfinite_fallbacks.load();
    d["inplace_outputs"] = s.inplace_outputs.load();
    d["evictions"] = s.evictions.load();
    d["cached_partitions"] = s.cached_partitions.load();
    return d;
  });
  m.def("_onednn_version", [] {
    return std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR) + "." +
           std::to_string(DNNL_VERSION_PATCH);
  });
}
