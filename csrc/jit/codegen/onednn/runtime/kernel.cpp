// The fusion group operator's calls: the inputs made readable, the compiled partition looked up
// (or compiled: here, with its GRAPH_DEBUG lines, PYTORCH_JIT_LOG_LEVEL=">>kernel"), executed on
// the tensors' own memory, or the group's ops run unfused. The other rooms: fusion_kernel.h.
#include "jit/codegen/onednn/runtime/fusion_kernel.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/strides.h>
#include <algorithm>
#include <cstring>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/llga_nodes.h"
#include "jit/codegen/onednn/runtime/profiled_layout.h"
#include "jit/codegen/onednn/runtime/channels_last_image.h"
#include "jit/codegen/onednn/runtime/inplace.h"
#include "onednn/pooled_qtensor.h"
#include "jit/codegen/onednn/runtime/kernel_registry.h"
#include "jit/codegen/onednn/runtime/layouts.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/runtime/to_dense.h"

namespace llga {

using dnnl::graph::logical_tensor;
using torch::jit::Stack;
using torch::jit::TensorType;

namespace {

void* data_of(const at::Tensor& t) {
  return is_llga_tensor(t) ? llga_impl(t).data() : const_cast<void*>(t.const_data_ptr());
}

// "opaque", "strided [..]" per output: what layout oneDNN chose (logged at compile time only).
std::string describe_layouts(const std::vector<CompiledPartition::Out>& outs) {
  std::string s;
  for (const auto& o : outs) {
    if (!s.empty()) s += ", ";
    s += o.lt.get_layout_type() == logical_tensor::layout_type::opaque ? "opaque"
                                                                        : "strided " + c10::str(c10::IntArrayRef(o.lt.get_strides()));
  }
  return s;
}

// The partition compiled for these layouts; where oneDNN takes no "any" output layout for it
// (oneDNN 3.12: a lone Reorder), compiled again with those outputs asked for strided (they still
// travel as LLGA tensors). `outputs` is left as last asked for.
dnnl::graph::compiled_partition compile_retrying_with_strided_outputs(const dnnl::graph::partition& partition,
                                                                      const std::vector<logical_tensor>& inputs,
                                                                      std::vector<logical_tensor>& outputs) {
  try {
    return partition.compile(inputs, outputs, runtime::engine());
  } catch (const dnnl::error& e) {
    if (!quirks::enabled("strided_output_retry")) throw;
    bool retried = false;
    for (auto& lt : outputs) {
      if (lt.get_layout_type() != logical_tensor::layout_type::any) continue;
      lt = logical_tensor(lt.get_id(), lt.get_data_type(), lt.get_dims(), logical_tensor::layout_type::strided);
      retried = true;
    }
    if (!retried) throw;
    GRAPH_DEBUG("oneDNN could not compile the partition for opaque outputs (", e.what(), "); asking for strided ones");
    return partition.compile(inputs, outputs, runtime::engine());
  }
}

}  // namespace

CompiledPartition::CompiledPartition() { runtime::stats().cached_partitions.fetch_add(1, std::memory_order_relaxed); }
CompiledPartition::~CompiledPartition() {
  runtime::stats().cached_partitions.fetch_sub(1, std::memory_order_relaxed);
  if (constant_bytes) runtime::constants_dropped(constant_bytes);
}

FusionKernel::FusionKernel(const torch::jit::Node* node)
    : subgraph_(node->g(c10::attr::Subgraph)),
      num_inputs_(node->inputs().size()),
      cache_(&runtime::stats().evictions) {
  group_id_ = node->hasAttribute(kGroupId) ? node->i(kGroupId) : -1;
  register_kernel(group_id_, this);
  profiler_name_ = fusion_group_name(*subgraph_);
  for (const Node* n : subgraph_->nodes()) held_back_op_ = held_back_op_ || n->hasAttribute(kSpeedRule);
  whole_fallback_ = !bind(node);
  if (!whole_fallback_)
    for (const InPort& port : in_ports_) constant_bytes_ += port.constant.defined() ? port.constant.nbytes() : 0;
  if (!whole_fallback_ && out_ports_.size() == 1 && !out_ports_[0].opaque && runtime::own_kernels_enabled()) {
    int8_ = int8_spec(*subgraph_);
    if (int8_ && int8_->dst_dtype != out_ports_[0].dtype) int8_.reset();
  }
}

FusionKernel::~FusionKernel() {
  unregister_kernel(group_id_, this);
}

std::string fusion_group_name(const torch::jit::Graph& subgraph) {
  std::string name = "llga::FusionGroup[";
  for (const Node* n : subgraph.nodes())
    if (n->kind() != c10::prim::Constant) name += std::string(name.back() == '[' ? "" : "+") + n->kind().toUnqualString();
  return name + "]";
}

void FusionKernel::release() {
  cache_.clear();  // a call executing one now holds its own reference
}

// Outside the cache's lock (compile_cache.h): other threads' calls go on meanwhile.
std::shared_ptr<CompiledPartition> FusionKernel::compile(const Inputs& inputs, c10::ArrayRef<c10::IValue> args) {
  runtime::flush_dropped_constants();  // a dropped model's weights, once they outweigh the live ones
  auto c = std::make_shared<CompiledPartition>();
  // For the profiled sizes the outputs' sizes (and eager's strides) are known; for other sizes
  // oneDNN infers them, and outputs PyTorch reads come back contiguous.
  bool profiled_sizes = true;
  for (const InPort& port : in_ports_) {
    const at::Tensor& t = port.input == kConstantPort ? port.constant : inputs[port.input];
    auto sizes = is_llga_tensor(t) ? llga_impl(t).desc().get_dims() : t.dim() == 0 ? std::vector<int64_t>{1} : t.sizes().vec();
    profiled_sizes = profiled_sizes && sizes == port.sizes;
  }
  if (int8_ && profiled_sizes)
    if (auto own = compile_int8(inputs)) return own;
  const Partition* part = &profiled_;
  std::unique_ptr<Partition> at_these_sizes;  // needed until compiled only
  if (!profiled_sizes) {
    std::shared_ptr<torch::jit::Graph> sized;
    switch (maps_at(args, &sized)) {
      case AtSizes::kUnfused: part = nullptr; break;
      case AtSizes::kAnySizes: part = any_sizes(); break;
      case AtSizes::kTheseSizes:  // null: mapped at these sizes, the group forms another partition
        at_these_sizes = partition_of(*sized, /*ranks_only=*/false);
        part = at_these_sizes.get();
        break;
    }
  }
  if (!part) {
    GRAPH_DEBUG("No partition of the group compiles for other sizes; running it unfused:\n", *subgraph_);
    c->fallback = true;
    return c;
  }
  const auto& in_ids = part->in_ids;
  const auto& out_ids = part->out_ids;
  std::vector<logical_tensor> inputs_lt;
  for (size_t p = 0; p < in_ports_.size(); ++p) {
    bool constant = in_ports_[p].input == kConstantPort;
    const at::Tensor& t = constant ? in_ports_[p].constant : inputs[in_ports_[p].input];
    auto prop = constant ? logical_tensor::property_type::constant : logical_tensor::property_type::variable;
    if (is_llga_tensor(t)) {
      const auto& d = llga_impl(t).desc();
      inputs_lt.push_back(d.get_layout_type() == logical_tensor::layout_type::opaque
                              ? logical_tensor(in_ids[p], d.get_data_type(), d.get_dims(), d.get_layout_id(), prop)
                              : logical_tensor(in_ids[p], d.get_data_type(), d.get_dims(),
                                               unit_dims_dense(d.get_dims(), d.get_strides()), prop));
    } else {
      bool scalar = t.dim() == 0;  // a 0-dim constant: [1] to oneDNN
      inputs_lt.emplace_back(in_ids[p], input_dtype(t.scalar_type()), scalar ? std::vector<int64_t>{1} : t.sizes().vec(),
                             scalar ? std::vector<int64_t>{1} : unit_dims_dense(t.sizes(), t.strides()), prop);
    }
  }
  std::vector<logical_tensor> outputs;
  for (size_t p = 0; p < out_ports_.size(); ++p) {
    const OutPort& port = out_ports_[p];
    auto dtype = *to_dnnl_dtype(port.dtype);
    auto sizes = profiled_sizes ? port.sizes : std::vector<int64_t>(port.sizes.size(), DNNL_GRAPH_UNKNOWN_DIM);
    outputs.push_back(port.opaque      ? logical_tensor(out_ids[p], dtype, sizes, logical_tensor::layout_type::any)
                      : profiled_sizes ? logical_tensor(out_ids[p], dtype, sizes, port.strides)
                                       : logical_tensor(out_ids[p], dtype, sizes, logical_tensor::layout_type::strided));
  }
  try {
    runtime::stats().compilations.fetch_add(1, std::memory_order_relaxed);
    c->partition = compile_retrying_with_strided_outputs(part->partition, inputs_lt, outputs);
    c->constant_bytes = constant_bytes_;  // the cache takes a copy of them now
    runtime::constants_alive(constant_bytes_);
    for (const auto& lt : inputs_lt) c->in.push_back({lt, dnnl::graph::tensor(lt, runtime::engine(), nullptr), nullptr});
    for (size_t p = 0; p < out_ids.size(); ++p) {
      CompiledPartition::Out o;
      o.lt = c->partition.query_logical_tensor(out_ids[p]);
      o.sizes = o.lt.get_dims();
      if (o.lt.get_layout_type() == logical_tensor::layout_type::strided) o.strides = o.lt.get_strides();
      if (out_ports_[p].qparams) o.format = memory_format_of(o.sizes, o.strides);
      o.tensor = dnnl::graph::tensor(o.lt, runtime::engine(), nullptr);
      c->out.push_back(std::move(o));
    }
    for (const auto& [in_id, out_id] : c->partition.get_inplace_ports()) {
      auto in = std::find(in_ids.begin(), in_ids.end(), in_id);
      auto out = std::find(out_ids.begin(), out_ids.end(), out_id);
      if (in == in_ids.end() || out == out_ids.end()) continue;
      size_t p_in = in - in_ids.begin(), p_out = out - out_ids.begin();
      // Only an input no other port of the group reads (conv(x) + x must not overwrite x early).
      size_t i = in_ports_[p_in].input;
      if (i == kConstantPort || inputs_[i].ports != 1) continue;
      c->inplace.emplace_back(p_in, p_out);
    }
    GRAPH_DEBUG("Compiled a partition of ", part->partition.get_ops_num(), " ops for ", c->in.size(), " inputs; outputs: ",
                describe_layouts(c->out));
  } catch (const std::exception& e) {  // dnnl::error, or a C++ exception oneDNN let through its C API
    GRAPH_DEBUG("oneDNN could not compile the partition (", e.what(), "); running it unfused:\n", *subgraph_);
    c->fallback = true;
  }
  return c;
}

std::shared_ptr<CompiledPartition> FusionKernel::compile_int8(const Inputs& inputs) {
  const Int8Spec& s = *int8_;
  const at::Tensor* residual = s.residual_input ? &inputs[*s.residual_input] : nullptr;
  const OutPort& port = out_ports_[0];
  // The output as the primitive writes it: a conv's channels-last, a linear's contiguous (an fp32
  // one only where PyTorch's strides are those).
  auto contiguous = c10::contiguous_strides(port.sizes);
  std::vector<int64_t> strides = s.linear ? std::vector<int64_t>(contiguous.begin(), contiguous.end()) : quantized_strides(port.sizes);
  std::string why = "its output is not contiguous";
  auto primitive = s.quantized_output() || port.strides == unit_dims_dense(port.sizes, strides)
                       ? Int8Primitive::create(s, inputs[s.src_input], residual, port.sizes, &why)
                       : nullptr;
  if (!primitive) {
    GRAPH_DEBUG("The int8 group runs as a partition: ", why);
    return nullptr;
  }
  runtime::stats().compilations.fetch_add(1, std::memory_order_relaxed);
  runtime::stats().int8_primitives.fetch_add(1, std::memory_order_relaxed);
  auto c = std::make_shared<CompiledPartition>();
  c->int8 = std::move(primitive);
  CompiledPartition::Out o;
  o.sizes = port.sizes;
  o.strides = strides;
  o.format = s.linear ? c10::MemoryFormat::Contiguous : c10::MemoryFormat::ChannelsLast;
  if (!s.quantized_output())  // what dense_reusable_as_output compares an fp32 residual with
    o.lt = logical_tensor(0, logical_tensor::data_type::f32, o.sizes, o.strides);
  c->out.push_back(std::move(o));
  // The sum accumulates into the residual's memory where nothing else reads it (as oneDNN Graph's
  // in-place port); never where the conv reads it too (conv(y) + y).
  for (size_t p = 0; residual && *s.residual_input != s.src_input && p < in_ports_.size(); ++p)
    if (in_ports_[p].input == *s.residual_input && inputs_[*s.residual_input].ports == 1) c->inplace.emplace_back(p, 0);
  GRAPH_DEBUG("Compiled the int8 ", s.linear ? "linear" : "convolution", " group as a oneDNN primitive");
  return c;
}

std::shared_ptr<CompiledPartition> FusionKernel::compiled_for(const Inputs& inputs, c10::ArrayRef<c10::IValue> args) {
  CompileCache<CompiledPartition>::Key key;
  for (const InPort& port : in_ports_)
    if (port.input != kConstantPort) append_layout_key(key, inputs[port.input]);
  return cache_.get(key, runtime::cache_capacity(), [&] { return compile(inputs, args); });
}

torch::jit::Code& FusionKernel::fallback_code() {
  std::call_once(fallback_code_once_, [&] { fallback_code_ = std::make_unique<torch::jit::Code>(subgraph_->copy(), "llga_fallback"); });
  return *fallback_code_;
}

void FusionKernel::run_fallback(Stack& stack) {
  runtime::stats().kernel_fallbacks.fetch_add(1, std::memory_order_relaxed);
  torch::jit::Code& code = fallback_code();
  for_pytorch(stack);
  torch::jit::InterpreterState(code).run(stack);
}

// The group's ops in PyTorch because the measured choice (or a pin) said so: no failure, counted apart.
void FusionKernel::run_unfused_by_choice(Stack& stack) {
  runtime::stats().unfused_by_choice.fetch_add(1, std::memory_order_relaxed);
  for_pytorch(stack);
  torch::jit::InterpreterState(fallback_code()).run(stack);
}

// The group's inputs (the stack's last num_inputs_) as PyTorch's ops take them: tensors densified,
// in eager's layout (in_profiled_layout); other inputs as they were.
void FusionKernel::for_pytorch(Stack& stack) const {
  for (size_t i = 0; i < num_inputs_; ++i) {
    auto& slot = stack[stack.size() - num_inputs_ + i];
    if (!slot.isTensor()) continue;
    at::Tensor t = llga_to_dense(slot.toTensor());
    auto profiled = subgraph_->inputs()[i]->type()->cast<TensorType>();
    slot = profiled ? in_profiled_layout(t, *profiled) : t;
  }
}

// The per-call path: no graph work, no strings; the cache lookup compares a key built on the stack
// under a shared lock, oneDNN's tensor objects are reused, and the only allocations are the
// outputs' memory.
void FusionKernel::run(Stack& stack) {
  RECORD_FUNCTION(profiler_name_, c10::ArrayRef<const c10::IValue>{});  // a flag test unless profiling
  if (whole_fallback_) return run_fallback(stack);
  Inputs inputs;
  auto args = torch::jit::last(stack, num_inputs_);
  for (size_t i = 0; i < num_inputs_; ++i) {
    inputs.push_back(args[i].isTensor() ? readable(args[i].toTensor(), inputs_[i].any_dense, inputs_[i].read_by_matmul,
                                                   inputs_[i].plain_only)
                                        : at::Tensor());
    if (inputs_[i].image) inputs.back() = image_to_channels_last(inputs.back());
    if (inputs_[i].channels_last) inputs.back() = plain_to_channels_last(inputs.back());
  }
  std::shared_ptr<CompiledPartition> compiled = compiled_for(inputs, args);
  CompiledPartition& c = *compiled;
  if (c.fallback.load(std::memory_order_relaxed)) return c.chosen_unfused ? run_unfused_by_choice(stack) : run_fallback(stack);
  if (c.checks_left.load(std::memory_order_relaxed) > 0) return run_checking_speed(c, inputs, args, stack);
  execute(c, inputs, args, stack);
}

void FusionKernel::execute(CompiledPartition& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, Stack& stack) {
  c10::SmallVector<at::Tensor, 4> outs(c.out.size());
  for (auto [p_in, p_out] : c.inplace) {
    size_t i = in_ports_[p_in].input;
    const OutPort& port = out_ports_[p_out];
    const CompiledPartition::Out& o = c.out[p_out];
    if ((port.opaque && reusable_as_output(inputs[i], args[i], inputs_[i].guarded, o.lt)) ||
        (!port.qparams && dense_reusable_as_output(inputs[i], args[i], inputs_[i].guarded, o.lt))) {
      outs[p_out] = inputs[i];
    } else if (port.qparams && quantized_reusable_as_output(inputs[i], args[i], inputs_[i].guarded, port.dtype, o.sizes, o.format)) {
      // An int8 residual add: the added codes are read before the output's are written over them.
      outs[p_out] = quantized_output_in(inputs[i], port.qparams->scale, port.qparams->zero_point, o.format);
    } else {
      continue;
    }
    runtime::stats().inplace_outputs.fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t p = 0; p < c.out.size(); ++p) {
    if (outs[p].defined()) continue;  // computed in place
    const CompiledPartition::Out& o = c.out[p];
    // An output only groups read is an LLGA tensor whatever layout oneDNN chose (blocked, or a
    // strided one such as NHWC): the next group reads its layout from it, and guards accept it.
    const OutPort& port = out_ports_[p];
    const auto& q = port.qparams;
    outs[p] = port.opaque ? empty_llga(o.lt, port.dtype)
              : q ? new_quantized_output(o.sizes, port.dtype, q->scale, q->zero_point, o.format)
                  : at::empty_strided(o.sizes, o.strides, at::TensorOptions().dtype(port.dtype));
  }
  if (c.int8) {
    const Int8Spec& s = *int8_;
    void* dst = data_of(outs[0]);
    if (s.residual_input) {  // the sum post-op adds to what dst holds
      const at::Tensor& r = inputs[*s.residual_input];
      if (data_of(r) != dst) std::memcpy(dst, data_of(r), r.nbytes());
    }
    std::lock_guard<std::mutex> lock(c.execute_mutex);
    c.int8->execute(data_of(inputs[s.src_input]), dst);
  } else {
    // oneDNN's C API takes arrays of its tensors' handles: built here on the stack (its C++
    // execute() builds two vectors a call).
    c10::SmallVector<const_dnnl_graph_tensor_t, 16> in_handles(c.in.size()), out_handles(c.out.size());
    std::lock_guard<std::mutex> lock(c.execute_mutex);
    // oneDNN's set_data_handle allocates (a new memory object per call): only changed pointers are
    // set. Weights never change, and the buffer pool hands the same buffers back call after call.
    for (size_t p = 0; p < c.in.size(); ++p) {
      const InPort& port = in_ports_[p];
      CompiledPartition::In& in = c.in[p];
      void* handle = data_of(port.input == kConstantPort ? port.constant : inputs[port.input]);
      if (handle != in.handle) in.tensor.set_data_handle(in.handle = handle);
      in_handles[p] = in.tensor.get();
    }
    for (size_t p = 0; p < c.out.size(); ++p) {
      CompiledPartition::Out& out = c.out[p];
      void* handle = data_of(outs[p]);
      if (handle != out.handle) out.tensor.set_data_handle(out.handle = handle);
      out_handles[p] = out.tensor.get();
    }
    dnnl::error::wrap_c_api(dnnl_graph_compiled_partition_execute(c.partition.get(), runtime::stream().get(), in_handles.size(),
                                                                  in_handles.data(), out_handles.size(), out_handles.data()),
                            "could not execute the compiled_partition");
  }
  runtime::stats().executions.fetch_add(1, std::memory_order_relaxed);
  torch::jit::drop(stack, num_inputs_);
  for (size_t j = 0; j < output_port_.size(); ++j) stack.emplace_back(outs[output_port_[j]]);
}

namespace {

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        kFusionGroup,
        [](const torch::jit::Node* node) -> torch::jit::Operation {
          auto kernel = std::make_shared<FusionKernel>(node);
          return [kernel](Stack& stack) { kernel->run(stack); };
        },
        c10::AliasAnalysisKind::PURE_FUNCTION),
});

}  // namespace

}  // namespace llga
