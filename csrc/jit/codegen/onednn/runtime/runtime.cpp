// Process-wide oneDNN objects (engine, per-thread stream, constant cache) and the fuser's settings and counters.
#include "jit/codegen/onednn/runtime/runtime.h"

#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "build_info.h"
#include "onednn/buffer_pool.h"
#include "onednn/torch_onednn.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace llga::runtime {

namespace {
// TORCH_LLGA_ENABLE=1 turns the fuser on when the library loads (servers gain it without code changes).
// Without torch's oneDNN it stays off, and says why (a server that preloads the library should not
// fail to start, nor fuse silently nothing).
bool enabled_by_environment() {
  const char* env = std::getenv("TORCH_LLGA_ENABLE");
  if (!env || std::strcmp(env, "1") != 0) return false;
  for (const std::string* error : {&onednn::load_error(), &torch_mismatch()})
    if (!error->empty()) std::fprintf(stderr, "%s; the fuser stays off\n", error->c_str());
  return true;
}

std::atomic<bool> g_enabled{enabled_by_environment()};
std::atomic<bool> g_fuse_all_partitions{false};
std::atomic<ShapePolicy> g_shape_policy{ShapePolicy::kCompile};
std::atomic<int64_t> g_cache_capacity{16};
std::atomic<bool> g_small_plans{!std::getenv("TORCH_LLGA_SMALL_PLANS") || std::strcmp(std::getenv("TORCH_LLGA_SMALL_PLANS"), "0") != 0};

// The constant weight cache: oneDNN keeps the reordered copy of each constant (frozen weight)
// input so weights are reordered once, not per call. On by default; DNNL_GRAPH_CONSTANT_CACHE=0
// turns it off. oneDNN's capacity is in MB and, once reached, it caches nothing more (no eviction):
// 1 TiB means "unbounded", the old on/off switch's meaning. An explicit
// ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY is left to oneDNN. Set before the first compilation
// (it applies to partitions compiled after it), when the engine is made.
constexpr size_t kConstantCacheMB = size_t(1) << 20;
void init_constant_cache() {
  if (std::getenv("ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY")) return;
  const char* env = std::getenv("DNNL_GRAPH_CONSTANT_CACHE");
  dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, env && std::strcmp(env, "0") == 0 ? 0 : kConstantCacheMB);
}

}  // namespace

bool constant_cache_enabled() {
  engine();  // the capacity is set with the engine
  return dnnl::graph::get_constant_tensor_cache_capacity(dnnl::engine::kind::cpu) > 0;
}

void flush_constant_cache() {
  size_t capacity = (engine(), dnnl::graph::get_constant_tensor_cache_capacity(dnnl::engine::kind::cpu));
  if (capacity != 0) {
    dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, 0);  // setting it flushes
    dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, capacity);
  }
  onednn::trim_buffer_pool();  // the buffers kept for reuse, the flushed weights among them
}

// oneDNN's compiled-partition cache is off where it can return a freed partition's kernel
// (onednn_quirks.h); each group keeps its own compiled partitions anyway.
void init_compiled_partition_cache() {
  if (quirks::stale_compiled_partition_cache()) dnnl::graph::set_compiled_partition_cache_capacity(0);
}

dnnl::engine& engine() {
  static dnnl::engine e = (init_constant_cache(), init_compiled_partition_cache(), dnnl::graph::make_engine_with_allocator(dnnl::engine::kind::cpu, 0, dnnl::graph::allocator(onednn::allocate_buffer, onednn::free_buffer)));
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

Stats& stats() {
  static Stats s;
  return s;
}

bool enabled() {
  return g_enabled.load(std::memory_order_relaxed) && onednn::load_error().empty() && torch_mismatch().empty();
}
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool fuse_all_partitions() { return g_fuse_all_partitions.load(std::memory_order_relaxed); }
void set_fuse_all_partitions(bool on) { g_fuse_all_partitions.store(on, std::memory_order_relaxed); }
ShapePolicy shape_policy() { return g_shape_policy.load(std::memory_order_relaxed); }
void set_shape_policy(ShapePolicy p) { g_shape_policy.store(p, std::memory_order_relaxed); }
bool small_plans_enabled() { return g_small_plans.load(std::memory_order_relaxed); }
void set_small_plans_enabled(bool on) { g_small_plans.store(on, std::memory_order_relaxed); }
int64_t cache_capacity() { return g_cache_capacity.load(std::memory_order_relaxed); }
void set_cache_capacity(int64_t n) { g_cache_capacity.store(n, std::memory_order_relaxed); }

}  // namespace llga::runtime
