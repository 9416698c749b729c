#pragma once
// The fuser's process-wide settings (its switch and knobs) and counters: read by the passes, the
// small-graph plan and the kernel, depending on none of them (torch_llga.stats() and the setters
// of torch_llga's Python face reach them through csrc/init.cpp).
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace llga::runtime {

// The fuser switch (always off when torch's oneDNN could not be bound: onednn::load_error()), read by the pass on every graph it optimizes.
bool enabled();
void set_enabled(bool on);

// The switch of the calling thread alone, on whatever the process-wide one says: a torch.compile
// graph (torch_llga/dynamo.py) runs under it, so it fuses without flipping what other threads'
// TorchScript modules get. Returns the thread's previous value.
bool set_enabled_in_thread(bool on);
// What the pass asks: is either switch on (and torch's oneDNN bound)?
bool fusing();

// Debug/test knob: make a group of every supported partition, also those not worth one (a lone
// relu, a short elementwise chain), so each mapping can be tested by itself.
bool fuse_all_partitions();
void set_fuse_all_partitions(bool on);

// What a group does with input sizes other than the profiled ones: compile a partition for them
// (kept in the group's cache) or run the group's unfused fallback. Groups holding a shape-specific
// op (a reshape to the profiled sizes, say) always fall back.
enum class ShapePolicy { kCompile, kFallback };
ShapePolicy shape_policy();
void set_shape_policy(ShapePolicy p);

// Whether whole graphs of tiny tensors run as one small-graph plan (small_plan.h); on by default,
// TORCH_LLGA_SMALL_PLANS=0 turns it off.
bool small_plans_enabled();
void set_small_plans_enabled(bool on);

// Whether patterns torch_llga has its own kernel for (kernels/) run it rather than oneDNN's, and
// int8 convolution and linear groups run as oneDNN primitives rather than partitions
// (int8_primitive.h); on
// unless TORCH_LLGA_OWN_KERNELS=0 when a graph is optimized (read then, for A/B comparisons).
bool own_kernels_enabled();

// Passes and own-kernel rows switched off by name (passes.h's pipeline() and own_kernel_table()):
// TORCH_LLGA_PASSES_OFF="name,..." when a graph is optimized, or set_switched_off (names checked by
// the caller). For A/B comparisons and for finding which pass a problem comes from.
bool switched_off(const char* name);
void set_switched_off(const std::vector<std::string>& names);
std::vector<std::string> switched_off_names();

// Compiled partitions each group keeps (one per input layout/shape), least recently used evicted first.
int64_t cache_capacity();
void set_cache_capacity(int64_t n);

// Counters of what the kernels and guards did, process-wide (torch_llga.stats()).
struct Stats {
  std::atomic<int64_t> executions{0};     // fused partition executions
  std::atomic<int64_t> compilations{0};   // partitions compiled (one per group and input layout)
  std::atomic<int64_t> partitionings{0};  // graphs oneDNN partitioned (one per block the fuser sees)
  std::atomic<int64_t> guard_failures{0}; // calls that took a group's unfused fallback: inputs differed from the profile
  std::atomic<int64_t> kernel_fallbacks{0};  // calls a kernel ran unfused because oneDNN could not compile
  std::atomic<int64_t> nonfinite_fallbacks{0};  // guard failures because an input held NaN or Inf
  std::atomic<int64_t> inplace_outputs{0};    // outputs computed in an input's memory (a residual add's)
  std::atomic<int64_t> evictions{0};          // compiled partitions dropped by a full cache
  std::atomic<int64_t> plan_runs{0};          // calls of small-graph plans (llga::SmallPlan)
  std::atomic<int64_t> plan_compilations{0};  // small-graph plans compiled (one per plan)
  std::atomic<int64_t> plan_misses{0};  // calls at other inputs than a plan's: the graph's version fused by groups ran
  std::atomic<int64_t> cached_partitions{0};  // compiled partitions alive now (freed with their module)
  std::atomic<int64_t> unfused_by_choice{0};  // calls of groups whose measured (or pinned) choice is PyTorch's ops
  std::atomic<int64_t> slow_partitions{0};    // compiled partitions run unfused: far slower than PyTorch (speed_check.cpp)
  std::atomic<int64_t> constant_cache_flushes{0};  // emptied because dropped kernels' weights outweighed live ones (runtime.cpp)
  std::atomic<int64_t> int8_primitives{0};  // of the compilations: int8 conv/linear groups built as one oneDNN primitive (int8_primitive.h)
  std::atomic<int64_t> to_dense_compilations{0};  // reorders to strided compiled by llga_to_dense (one per layout, to_dense.cpp)
};
Stats& stats();

}  // namespace llga::runtime
