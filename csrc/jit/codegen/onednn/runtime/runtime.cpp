// Process-wide oneDNN objects: the engine, a stream per thread, the constant weight cache.
#include "jit/codegen/onednn/runtime/runtime.h"

#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "onednn/buffer_pool.h"
#include "onednn/torch_onednn.h"

#include <atomic>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace llga::runtime {

namespace {
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

namespace {
void empty_constant_cache() {
  size_t capacity = (engine(), dnnl::graph::get_constant_tensor_cache_capacity(dnnl::engine::kind::cpu));
  if (capacity != 0) {
    dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, 0);  // setting it flushes
    dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, capacity);
  }
}
}  // namespace

void flush_constant_cache() {
  empty_constant_cache();
  onednn::trim_buffer_pool();  // the buffers kept for reuse, the flushed weights among them
}

namespace {
// oneDNN 3.12 never removes one entry of the constant cache: a reordered weight stays until the
// cache is emptied whole, also after its compiled partition and the weight itself are gone (its
// key holds the partition's id and the weight's address, neither seen again). So compiled
// partitions report the bytes of their constant inputs as they are compiled and destroyed (each
// compilation, one per input size, caches its own copy: a model reloaded with 16 sizes a group
// left 16 copies), and once the destroyed ones reach the live ones (and kFlushAfterDeadBytes) the
// cache is emptied at the next compilation (never in a destructor: one may run at exit, after
// oneDNN's own statics are gone). The dropped weights it keeps stay about the live ones' size, and
// each live compilation reorders its weights once more: at most the dropped weights' worth.
// The flushed buffers go to the buffer pool (not trimmed: the live groups' reorders take them).
constexpr size_t kFlushAfterDeadBytes = size_t(4) << 20;
std::mutex g_constants_mutex;
size_t g_live_constant_bytes = 0, g_dead_constant_bytes = 0;
std::atomic<bool> g_flush_due{false};
}  // namespace

void constants_alive(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_constants_mutex);
  g_live_constant_bytes += bytes;
}

void constants_dropped(size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(g_constants_mutex);
  g_live_constant_bytes -= std::min(bytes, g_live_constant_bytes);
  g_dead_constant_bytes += bytes;
  if (g_dead_constant_bytes < std::max(g_live_constant_bytes, kFlushAfterDeadBytes)) return;
  g_dead_constant_bytes = 0;
  g_flush_due.store(true, std::memory_order_relaxed);
}

void flush_dropped_constants() {
  if (!g_flush_due.exchange(false, std::memory_order_relaxed) || !constant_cache_enabled()) return;
  stats().constant_cache_flushes.fetch_add(1, std::memory_order_relaxed);
  empty_constant_cache();
#ifdef __GLIBC__
  // The dropped models' memory (weights, compiled kernels) was freed between live allocations of
  // glibc's per-thread heaps, which keep such holes resident: their pages go back to the system.
  malloc_trim(0);
#endif
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

}  // namespace llga::runtime
