#pragma once
// The llga::FusionGroup operator: compiles its partition on first use for the actual inputs,
// caches the compiled partition keyed by the inputs' sizes, strides (or opaque layout) and dtypes,
// and executes it on the tensors' own memory.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <ATen/Tensor.h>
#include <c10/util/SmallVector.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

#include "jit/codegen/onednn/mapping/graph_builder.h"
#include "jit/codegen/onednn/mapping/op_table.h"

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace llga {

class FusionKernel {
 public:
  explicit FusionKernel(const torch::jit::Node* node);
  ~FusionKernel();
  void run(torch::jit::Stack& stack);
  // Drops every compiled partition (and with it oneDNN's reordered copies of the weights); the
  // next call compiles again.
  void release();

 private:
  static constexpr size_t kConstantPort = SIZE_MAX;

  // Timed executions per compiled partition against its unfused ops (run_checking_speed).
  static constexpr int kSpeedChecks = 2;

  // One compilation: for inputs with exactly these layouts.
  struct Compiled {
    Compiled();
    ~Compiled();
    std::vector<int64_t> key;  // per input port: dtype, layout id or -1, ndim, sizes, strides
    std::vector<dnnl::graph::logical_tensor> inputs, outputs;  // as compiled / as queried
    std::vector<std::vector<int64_t>> out_sizes, out_strides;  // per output port, for PyTorch-read outputs
    std::vector<c10::MemoryFormat> out_formats;  // per output port: a quantized output's memory format
    dnnl::graph::compiled_partition partition;
    // Run the unfused subgraph instead: oneDNN could not compile this, or ran it far slower than
    // PyTorch runs the ops (run_checking_speed: set after compilation, while other threads read it).
    std::atomic<bool> fallback{false};
    // The speed check (kernel.cpp, run_checking_speed): the first execution is a warm-up, the next
    // kSpeedChecks each also time the group's ops unfused; one far slower every time runs unfused.
    std::atomic<int> checks_left{kSpeedChecks + 1};
    int slow_verdicts = 0;
    std::mutex check_mutex;
    std::mutex execute_mutex;  // a compiled partition must not execute on two threads at once
    // Made once; each call only points them at its tensors' memory (under execute_mutex).
    std::vector<dnnl::graph::tensor> in_tensors, out_tensors;
    std::vector<void*> in_handles, out_handles;  // what each points at now
    // (input port, output port) pairs oneDNN may compute in place: a conv or matmul with a sum
    // post-op accumulates into the added tensor's buffer instead of copying it to the output first.
    std::vector<std::pair<size_t, size_t>> inplace;
  };

  using Inputs = c10::SmallVector<at::Tensor, 8>;
  using Key = c10::SmallVector<int64_t, 64>;

  // Shared: another thread may evict the entry from the cache while this one executes it.
  // args: the call's arguments (for maps_at).
  std::shared_ptr<Compiled> compiled_for(const Inputs& inputs, c10::ArrayRef<c10::IValue> args);
  // The compiled partition on these inputs, its outputs replacing the arguments on the stack.
  void execute(Compiled& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, torch::jit::Stack& stack);
  void run_checking_speed(Compiled& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, torch::jit::Stack& stack);
  torch::jit::Code& fallback_code();
  void for_pytorch(torch::jit::Stack& stack) const;
  void compile(Compiled& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args);
  bool maps_at(c10::ArrayRef<c10::IValue> args);
  void run_fallback(torch::jit::Stack& stack);

  // Reads the group node's attributes and the partition's ports into the structs below; false if
  // the partition cannot run this group (every call then runs the subgraph unfused).
  bool bind(const torch::jit::Node* node);

  std::shared_ptr<torch::jit::Graph> subgraph_;
  int64_t group_id_ = -1;
  std::string profiler_name_;
  size_t num_inputs_ = 0;
  bool whole_fallback_ = false;  // the partition does not fit the group (see bind)

  // A partition with its port ids, in the order of in_ports_ and out_ports_.
  struct Partition {
    dnnl::graph::partition partition;
    std::vector<size_t> in_ids, out_ids;
  };
  // The fuser's partition, for the profiled sizes; for other sizes the subgraph's partition built
  // from ranks alone, on the first such call (any_sizes_made_; null: none with the same ports).
  c10::intrusive_ptr<GroupPartition> ports_;  // what each port of both partitions reads or is
  Partition profiled_;
  std::unique_ptr<Partition> any_sizes_;
  bool any_sizes_made_ = false;
  const Partition* any_sizes();

  // Per input of the group node.
  struct Input {
    bool guarded = false;    // a guard's output (kGuardedInputs)
    bool any_dense = false;  // read in any dense layout (see readable())
    bool read_by_matmul = false;  // a matmul reads it (see readable())
    bool plain_only = false;      // read by a chain of binary ops: contiguous only (see readable())
    bool image = false;           // read as a convolution's source only (see image_to_channels_last())
    size_t ports = 0;        // how many input ports read it
  };
  // Per input port of the partition.
  struct InPort {
    size_t input = kConstantPort;  // the group input it reads, or kConstantPort: `constant`
    at::Tensor constant;           // the frozen weight it reads
    std::vector<int64_t> sizes;    // as profiled
  };
  // Per output port of the partition.
  struct OutPort {
    bool opaque = false;  // read by groups only: may stay in oneDNN's layout
    c10::ScalarType dtype = c10::ScalarType::Float;
    std::vector<int64_t> sizes, strides;  // as profiled; strides eager's when dense, else contiguous
    std::optional<QuantParams> qparams;   // a quantized output's scale and zero point
  };
  std::vector<Input> inputs_;
  std::vector<InPort> in_ports_;
  std::vector<OutPort> out_ports_;
  std::vector<size_t> output_port_;  // group output -> its output port

  std::mutex cache_mutex_;
  std::list<std::shared_ptr<Compiled>> cache_;  // most recently used first
  std::unique_ptr<torch::jit::Code> fallback_code_;
};

// Releases the compiled partitions of the groups in g (also inside its blocks and the optimized
// graphs of its fallback functions), or of every group in the process when g is null.
// Returns how many compiled partitions were dropped.
int64_t release_compiled_partitions(const torch::jit::Graph* g);

}  // namespace llga
