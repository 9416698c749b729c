#pragma once
// The llga::FusionGroup operator: compiles its partition on first use for the actual inputs,
// caches the compiled partition keyed by the inputs' sizes, strides (or opaque layout) and dtypes,
// and executes it on the tensors' own memory. Its rooms, a file each in runtime/:
//   kernel.cpp           run, compile (and its retry with strided outputs), execute, fallback
//   bind.cpp             the group node and its partition's ports read into Input/InPort/OutPort
//   layouts.{h,cpp}      which input layouts oneDNN is handed, the cache key, output layouts
//   channels_last_image  a model's NCHW image interleaved to NHWC (SIMD)
//   compile_cache.h      compiled partitions by key: each compiled once, outside the lock
//   int8_primitive.{h,cpp}  an int8 convolution or linear group as one oneDNN primitive
//   new_sizes.cpp        re-checking the group's ops at sizes the fuser never saw
//   inplace.{h,cpp}      when an output may take an input's memory (the reference-count rule)
//   speed_check.cpp      running the partition unfused where oneDNN is far slower
//   kernel_registry      every live kernel, for torch_llga.release()
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <ATen/Tensor.h>
#include <c10/util/SmallVector.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

#include "jit/codegen/onednn/mapping/graph_builder.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/runtime/compile_cache.h"
#include "jit/codegen/onednn/runtime/compiled_partition.h"
#include "jit/codegen/onednn/runtime/int8_primitive.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
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

  using Inputs = c10::SmallVector<at::Tensor, 8>;

  // Shared: another thread may evict the entry from the cache while this one executes it.
  // args: the call's arguments (for maps_at).
  std::shared_ptr<CompiledPartition> compiled_for(const Inputs& inputs, c10::ArrayRef<c10::IValue> args);
  // The compiled partition on these inputs, its outputs replacing the arguments on the stack.
  void execute(CompiledPartition& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, torch::jit::Stack& stack);
  void run_checking_speed(CompiledPartition& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, torch::jit::Stack& stack);
  torch::jit::Code& fallback_code();
  void for_pytorch(torch::jit::Stack& stack) const;
  std::shared_ptr<CompiledPartition> compile(const Inputs& inputs, c10::ArrayRef<c10::IValue> args);
  // The group as an int8 convolution or matmul primitive for these inputs (at the profiled sizes), or null.
  std::shared_ptr<CompiledPartition> compile_int8(const Inputs& inputs);
  // How the group's ops map at other sizes than profiled (new_sizes.cpp).
  enum class AtSizes { kUnfused, kAnySizes, kTheseSizes };
  struct Partition;
  AtSizes maps_at(c10::ArrayRef<c10::IValue> args, std::shared_ptr<torch::jit::Graph>* sized);
  std::unique_ptr<Partition> partition_of(torch::jit::Graph& graph, bool ranks_only);
  void run_fallback(torch::jit::Stack& stack);
  void run_unfused_by_choice(torch::jit::Stack& stack);

  // Reads the group node's attributes and the partition's ports into the structs below; false if
  // the partition cannot run this group (every call then runs the subgraph unfused).
  bool bind(const torch::jit::Node* node);

  std::shared_ptr<torch::jit::Graph> subgraph_;
  int64_t group_id_ = -1;
  std::string profiler_name_;
  size_t num_inputs_ = 0;
  bool whole_fallback_ = false;  // the partition does not fit the group (see bind)
  bool held_back_op_ = false;    // an op a measured speed rule keeps out: slower here is no news
  // Of the weights it reads: what oneDNN's constant cache keeps of each compiled partition
  // (runtime.h; an int8 primitive keeps its own copy, freed with it: none in the cache).
  size_t constant_bytes_ = 0;

  // A partition with its port ids, in the order of in_ports_ and out_ports_.
  struct Partition {
    dnnl::graph::partition partition;
    std::vector<size_t> in_ids, out_ids;
  };
  // The fuser's partition, for the profiled sizes; for other sizes the subgraph's partition built
  // from ranks alone, on the first such call (null: none with the same ports).
  c10::intrusive_ptr<GroupPartition> ports_;  // what each port of both partitions reads or is
  Partition profiled_;
  std::unique_ptr<Partition> any_sizes_;
  std::once_flag any_sizes_once_;
  const Partition* any_sizes();

  // Per input of the group node.
  struct Input {
    bool guarded = false;    // a guard's output (kGuardedInputs)
    bool any_dense = false;  // read in any dense layout (see readable())
    bool read_by_matmul = false;  // a matmul reads it (see readable())
    bool plain_only = false;      // read by a chain of binary ops: contiguous only (see readable())
    bool image = false;           // read as a convolution's source only (see image_to_channels_last())
    bool channels_last = false;   // read by a 1-D/3-D pooling: channels-last (plain_to_channels_last())
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
  std::optional<Int8Spec> int8_;  // an int8 convolution or linear group (int8_primitive.h)

  CompileCache<CompiledPartition> cache_;  // by the input ports' layouts (layouts.h, append_layout_key)
  std::unique_ptr<torch::jit::Code> fallback_code_;
  std::once_flag fallback_code_once_;
};

// What torch.profiler shows for a group of this subgraph: "llga::FusionGroup[_convolution+relu]".
std::string fusion_group_name(const torch::jit::Graph& subgraph);

// Releases the compiled partitions of the groups in g (also inside its blocks and the optimized
// graphs of its fallback functions), or of every group in the process when g is null.
// Returns how many compiled partitions were dropped.
int64_t release_compiled_partitions(const torch::jit::Graph* g);

}  // namespace llga
