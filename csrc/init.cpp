// The Python module torch_llga._C. Loading it registers the pass pipeline and the operators
// (static registrations in pipeline.cpp and kernel.cpp); these functions only flip the switch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

#include <sstream>

#include "jit/codegen/onednn/runtime/compile_cache.h"
#include "jit/codegen/onednn/runtime/fusion_kernel.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "build_info.h"
#include "onednn/buffer_pool.h"
#include "onednn/cpu_features.h"
#include "onednn/torch_onednn.h"
#include "script_door.h"
#include "state_snapshot.h"

PYBIND11_MODULE(_C, m) {
  // torch's oneDNN could not be bound (see torch_onednn.h): the import fails with the reason.
  if (!llga::onednn::load_error().empty()) throw pybind11::import_error(llga::onednn::load_error());
  // Reached only past torch_llga/_build.py's check of the recorded torch (a library loaded by hand).
  if (!llga::torch_mismatch().empty()) throw pybind11::import_error(llga::torch_mismatch());
  if (auto error = llga::onednn::buffer_pool_env_error(); !error.empty()) throw pybind11::import_error(error);
  m.def("_set_enabled", &llga::runtime::set_enabled);
  m.def("_is_enabled", &llga::runtime::enabled);
  m.def("_set_enabled_in_thread", &llga::runtime::set_enabled_in_thread);
  m.def("_set_fuse_all_partitions", &llga::runtime::set_fuse_all_partitions);
  m.def("_set_small_plans", &llga::runtime::set_small_plans_enabled);
  m.def("_small_plans", &llga::runtime::small_plans_enabled);
  m.def("_set_shape_policy", [](bool compile) {
    llga::runtime::set_shape_policy(compile ? llga::runtime::ShapePolicy::kCompile : llga::runtime::ShapePolicy::kFallback);
  });
  m.def("_shape_policy_is_compile", [] { return llga::runtime::shape_policy() == llga::runtime::ShapePolicy::kCompile; });
  // The state a script holds baked in (a model's parameters and buffers), checked on every call of
  // the torch.compile and export doors: the same tensor objects, none written in place (version) or
  // given other memory (`p.data = t`) since: one C++ call for hundreds of weights.
  pybind11::class_<llga::StateSnapshot>(m, "StateSnapshot")
      .def(pybind11::init<const pybind11::sequence&, const std::vector<int64_t>&>())
      .def("holds", &llga::StateSnapshot::holds);
  llga::bind_script_door(m);
  m.def("_set_cache_capacity", &llga::runtime::set_cache_capacity);
  m.def("_cache_capacity", &llga::runtime::cache_capacity);
  m.def("_release", [](const std::shared_ptr<torch::jit::Graph>& g) { return llga::release_compiled_partitions(g.get()); });
  m.def("_release_all", [] { return llga::release_compiled_partitions(nullptr); });
  // For tests only: each compilation of a new key sleeps this long first (0: none), so a test can
  // show other threads' cached calls of the group going on meanwhile (test_threads.py).
  m.def("_test_delay_compile_ms", &llga::set_compile_delay_for_tests);
  m.def("_constant_cache_enabled", &llga::runtime::constant_cache_enabled);
  m.def("_flush_constant_cache", &llga::runtime::flush_constant_cache);
  m.def("_buffer_pool_limit", &llga::onednn::buffer_pool_limit);
  m.def("_set_buffer_pool_limit", &llga::onednn::set_buffer_pool_limit);
  m.def("_stats", [] {
    auto& s = llga::runtime::stats();
    pybind11::dict d;
    d["executions"] = s.executions.load();
    d["compilations"] = s.compilations.load();
    d["int8_primitives"] = s.int8_primitives.load();
    d["partitionings"] = s.partitionings.load();
    d["guard_failures"] = s.guard_failures.load();
    d["kernel_fallbacks"] = s.kernel_fallbacks.load();
    d["nonfinite_fallbacks"] = s.nonfinite_fallbacks.load();
    d["inplace_outputs"] = s.inplace_outputs.load();
    d["evictions"] = s.evictions.load();
    d["plan_runs"] = s.plan_runs.load();
    d["plan_compilations"] = s.plan_compilations.load();
    d["plan_misses"] = s.plan_misses.load();
    d["cached_partitions"] = s.cached_partitions.load();
    d["kept_buffer_bytes"] = llga::onednn::kept_buffer_bytes();
    d["slow_partitions"] = s.slow_partitions.load();
    d["unfused_by_choice"] = s.unfused_by_choice.load();
    d["to_dense_compilations"] = s.to_dense_compilations.load();
    d["constant_cache_flushes"] = s.constant_cache_flushes.load();
    d["measured_choices"] = llga::choices::measured_count();
    return d;
  });
  // Choices between ways to run the same ops (settings/choices.h): the sites, pins, and records.
  m.def("_choice_sites", [] {
    pybind11::list rows;
    for (const auto& s : llga::choices::sites()) {
      pybind11::dict d;
      d["site"] = s.name;
      d["candidates"] = s.candidates;
      d["default"] = s.candidates.front();
      d["margin"] = s.margin;
      d["margin_us"] = s.margin_ns / 1e3;
      d["what"] = s.what;
      rows.append(d);
    }
    return rows;
  });
  m.def("_set_choice_pins", [](const std::string& spec) {
    try {
      llga::choices::set_pins(spec);
    } catch (const std::invalid_argument& e) {
      throw pybind11::value_error(e.what());
    }
  });
  m.def("_choice_pins", &llga::choices::pins);
  // For tests only: machine_busy() answers this (1 busy, 0 quiet) instead of /proc/stat (-1).
  m.def("_test_machine_busy", &llga::choices::set_machine_busy_for_tests);
  m.def("_choices", [] {
    pybind11::list rows;
    for (const auto& r : llga::choices::records()) {
      pybind11::dict d;
      d["site"] = r.site;
      d["subject"] = r.subject;
      d["key"] = r.key;
      d["chosen"] = r.chosen;
      d["how"] = r.how;
      pybind11::dict times;
      for (const auto& [name, us] : r.best_us) times[pybind11::str(name)] = us;
      d["best_us"] = times;
      d["group_id"] = r.group_id;
      d["margin"] = r.margin;
      d["margin_us"] = r.margin_ns / 1e3;
      d["seq"] = r.seq;
      rows.append(d);
    }
    return rows;
  });
  // Each pass alone, for IR-in / IR-out tests (test_passes.py): the graph is changed in place.
  // The pipeline's passes by name, and each own-kernel rewrite as _jit_pass_own_<row>.
  for (const llga::PassEntry& pass : llga::pipeline())
    m.def((std::string("_jit_pass_") + pass.name).c_str(), [run = pass.run](std::shared_ptr<torch::jit::Graph> g) { run(g); });
  for (const llga::OwnKernelRow& row : llga::own_kernel_table())
    if (row.apply)
      m.def((std::string("_jit_pass_own_") + row.name).c_str(), [run = row.apply](std::shared_ptr<torch::jit::Graph> g) { run(g); });
  m.def("_passes", [] {
    pybind11::list rows;
    for (const llga::PassEntry& pass : llga::pipeline()) {
      pybind11::dict d;
      d["name"] = pass.name;
      d["what"] = pass.what;
      d["required"] = pass.required;
      rows.append(d);
    }
    return rows;
  });
  m.def("_own_kernel_table", [] {
    static const char* phases[] = {"early", "before_fuser", "after_guards", "inside_pass"};
    pybind11::list rows;
    for (const llga::OwnKernelRow& row : llga::own_kernel_table()) {
      pybind11::dict d;
      d["name"] = row.name;
      d["kernel"] = row.kernel;
      d["takes"] = row.takes;
      d["dtypes"] = row.dtypes;
      d["cpu"] = row.cpu;
      d["choice"] = row.choice;
      d["phase"] = phases[static_cast<int>(row.phase)];
      rows.append(d);
    }
    return rows;
  });
  // Passes and own-kernel rows switched off by name (TORCH_LLGA_PASSES_OFF), checked here.
  m.def("_set_passes_off", [](const std::vector<std::string>& names) {
    for (const auto& name : names) {
      bool known = false;
      std::string switchable;
      for (const llga::PassEntry& pass : llga::pipeline()) {
        if (!pass.required) switchable += std::string(switchable.empty() ? "" : ", ") + pass.name;
        if (name == pass.name && pass.required)
          throw pybind11::value_error("pass '" + name + "' cannot be switched off: without it results would be wrong");
        known = known || name == pass.name;
      }
      for (const llga::OwnKernelRow& row : llga::own_kernel_table()) {
        switchable += std::string(", ") + row.name;
        known = known || name == row.name;
      }
      if (!known) throw pybind11::value_error("no pass or own kernel '" + name + "'; known: " + switchable);
    }
    llga::runtime::set_switched_off(names);
  });
  m.def("_passes_off", &llga::runtime::switched_off_names);
  // The op table, for tests that walk it: per entry its schema, whether it maps to oneDNN, its
  // flags by name and its small-graph plan step (0: none).
  m.def("_op_table", [] {
    pybind11::list rows;
    for (const llga::OpEntry& e : llga::op_table()) {
      pybind11::list flags;
      for (unsigned bit = 1; bit; bit <<= 1)
        if ((e.flags & bit) && llga::flag_name(bit)) flags.append(llga::flag_name(bit));
      pybind11::dict row;
      row["schema"] = e.schema;
      row["onednn"] = e.maps_to_onednn();
      row["onednn_op"] = e.maps_to_onednn() ? llga::kind_name(e.kind) : "";
      row["flags"] = flags;
      row["plan_step"] = static_cast<int>(e.plan_step);
      rows.append(row);
    }
    return rows;
  });
  m.def("_onednn_version", &llga::onednn::version);
  m.def("_onednn_library", [] { return llga::onednn::library_path(); });
  m.def("_quirk_active", [](const std::string& name) { return llga::quirks::enabled(name.c_str()); });
  // The quirk registry (onednn_quirks.cpp), a dict a row; active_here: the workaround applies here.
  m.def("_quirks", [] {
    auto words = [](const char* s) {
      pybind11::list l;
      std::istringstream in(s);
      for (std::string w; in >> w;) l.append(w);
      return l;
    };
    auto or_none = [](const char* s) { return *s ? pybind11::object(pybind11::str(s)) : pybind11::object(pybind11::none()); };
    pybind11::list rows;
    for (const auto& q : llga::quirks::registry()) {
      pybind11::dict d;
      d["name"] = q.name;
      d["fault"] = q.fault;
      d["seen_on"] = words(q.seen_on);
      d["fixed_in"] = or_none(q.fixed_in);
      d["test"] = words(q.test);
      d["asked_in"] = q.asked_in;
      d["kernels"] = or_none(q.kernels);
      d["measured"] = q.measured;  // a speed rule timed against the fused form (passes/speed_choices.cpp)
      d["active_here"] = llga::quirks::enabled(q.name);
      rows.append(d);
    }
    return rows;
  });
  if (auto warning = llga::quirks::off_list_warning(); !warning.empty())
    if (PyErr_WarnEx(PyExc_UserWarning, warning.c_str(), 1) < 0) throw pybind11::error_already_set();
  m.def("_onednn_cpu", [] {
    const auto& cpu = llga::onednn::cpu();
    pybind11::dict d;
    d["isa"] = cpu.isa;
    d["int8_vnni"] = cpu.int8_vnni;
    d["bf16"] = cpu.bf16;
    return d;
  });
  m.def("_cpu_features", [] {  // what the own kernels can run here (onednn/cpu_features.h)
    const auto& f = llga::cpu_features();
    pybind11::dict d;
    d["avx2_fma"] = f.avx2_fma;
    d["avx512"] = f.avx512;
    d["avx512_bf16"] = f.avx512_bf16;
    d["amx_bf16"] = f.amx_bf16;
    return d;
  });
}
