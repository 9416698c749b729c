#pragma once
// Process-wide oneDNN objects: the engine, a stream per thread, the constant weight cache. The
// fuser's settings and counters: settings/settings.h.
#include <oneapi/dnnl/dnnl_graph.hpp>

#include "jit/codegen/onednn/settings/settings.h"

namespace llga::runtime {

dnnl::engine& engine();
dnnl::stream& stream();  // one per thread: oneDNN streams are not meant to be shared across threads

// oneDNN's buffers come from the buffer pool (onednn/buffer_pool.h), which the engine is made with.

// oneDNN's constant weight cache (reordered frozen weights): whether it is on, and dropping what it
// holds (every module's; each reorders its weights again on its next call).
bool constant_cache_enabled();
void flush_constant_cache();
// A kernel's constant inputs (frozen weights) in bytes, once a partition of it compiles (an int8
// primitive's copy is its own: runtime/int8_primitive.h) and as it is destroyed; once the dropped
// ones' entries (kept by oneDNN until a flush) outweigh the live ones, the next
// flush_dropped_constants() (a compilation's) empties the cache.
void constants_alive(size_t bytes);
void constants_dropped(size_t bytes);
void flush_dropped_constants();

}  // namespace llga::runtime
