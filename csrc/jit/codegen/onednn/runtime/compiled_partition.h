#pragma once
// One compilation of a fusion group's partition, for inputs of exactly one layout each (the key
// it is cached under, compile_cache.h), with what each of its ports needs per call in one place.
#include <c10/core/MemoryFormat.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace llga {

class Int8Primitive;

struct CompiledPartition {
  // Timed executions against the group's unfused ops (speed_check.cpp): at most this many.
  static constexpr int kSpeedChecks = 3;

  CompiledPartition();   // counted in stats().cached_partitions
  ~CompiledPartition();

  struct In {
    dnnl::graph::logical_tensor lt;  // as compiled
    // Made once; each call only points it at its tensor's memory (under execute_mutex), and only
    // when that moved: oneDNN's set_data_handle allocates.
    dnnl::graph::tensor tensor;
    void* handle = nullptr;          // what `tensor` points at now
  };
  struct Out {
    dnnl::graph::logical_tensor lt;  // as oneDNN chose it (queried after compiling)
    std::vector<int64_t> sizes, strides;  // for an output PyTorch reads (strides empty if opaque)
    c10::MemoryFormat format = c10::MemoryFormat::Contiguous;  // a quantized output's memory format
    dnnl::graph::tensor tensor;
    void* handle = nullptr;
  };
  std::vector<In> in;    // per input port of the partition
  std::vector<Out> out;  // per output port
  dnnl::graph::compiled_partition partition;
  // Or, for an int8 convolution or linear group, the primitive that runs it instead (int8_primitive.h).
  std::shared_ptr<Int8Primitive> int8;

  // (input port, output port) pairs oneDNN may compute in place: a conv or matmul with a sum
  // post-op accumulates into the added tensor's buffer instead of copying it to the output first.
  std::vector<std::pair<size_t, size_t>> inplace;

  // The bytes of the frozen weights it reads, which oneDNN's constant cache keeps a reordered copy
  // of for this compilation (one per input size: runtime.h, constants_alive): reported alive when
  // compiled, dropped with it (a dropped module, an eviction, release()).
  size_t constant_bytes = 0;

  // Run the unfused subgraph instead: oneDNN could not compile this, or the measured choice
  // (speed_check.cpp) found PyTorch running the group's ops faster (set while other threads read it).
  std::atomic<bool> fallback{false};
  bool chosen_unfused = false;  // set with `fallback` by the choice: its calls are no kernel fallbacks
  // The measured choice: the first execution is a warm-up, the next kSpeedChecks each also time the
  // group's ops unfused (fewer when the partition is clearly faster); 0 when decided or pinned.
  std::atomic<int> checks_left{kSpeedChecks + 1};
  // Best times so far (under check_mutex): wall and the calling thread's CPU, fused and unfused.
  double fused_ns = 1e300, unfused_ns = 1e300, fused_cpu_ns = 1e300, unfused_cpu_ns = 1e300;
  int unfused_wins = 0;  // rounds PyTorch's ops won by the margin, on both clocks
  int busy_calls = 0;  // checked calls that found the machine busy (choices::machine_busy): not timed
  double margin = 0, margin_ns = 0;  // the margin the rounds were judged with
  std::mutex check_mutex;
  std::mutex execute_mutex;  // a compiled partition must not execute on two threads at once
};

}  // namespace llga
