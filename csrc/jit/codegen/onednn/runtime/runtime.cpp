// Process-wide oneDNN objects: the engine, a stream per thread, the constant weight cache.
#include "jit/codegen/onednn/runtime/runtime.h"

#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "onednn/buffer_pool.h"
#include "onednn/torch_onednn.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

}  // namespace llga::runtime
