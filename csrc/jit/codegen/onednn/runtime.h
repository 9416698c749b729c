#pragma once
// Process-wide oneDNN objects and settings shared by the passes and the kernel.
#include <oneapi/dnnl/dnnl_graph.hpp>

#include <atomic>
#include <cstdint>

namespace llga::runtime {

dnnl::engine& engine();
dnnl::stream& stream();  // one per thread: oneDNN streams are not meant to be shared across threads

// The fuser switch, read by the pass on every graph it optimizes.
bool enabled();
void set_enabled(bool on);

// Debug/test knob: make a group of every supported partition, also those not worth one (a lone
// relu, a short elementwise chain), so each mapping can be tested by itself.
bool fuse_all_partitions();
void set_fuse_all_partitions(bool on);

// Counters of what the kernels and guards did, process-wide (torch_llga.stats()).
struct Stats {
  std::atomic<int64_t> executions{0};     // fused partition executions
  std::atomic<int64_t> compilations{0};   // partitions compiled (one per group and input layout)
  std::atomic<int64_t> guard_failures{0}; // calls that took the unfused fallback: inputs differed from the profile
  std::atomic<int64_t> kernel_fallbacks{0};  // calls a kernel ran unfused because oneDNN could not compile
};
Stats& stats();

}  // namespace llga::runtime
