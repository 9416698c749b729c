// Binding a fusion group to its partition: the group node's attributes (guarded inputs, output
// layouts) and the partition's ports read once, at the kernel's creation, into the per-input and
// per-port structs the calls use (FusionKernel::Input, InPort, OutPort).
#include "jit/codegen/onednn/runtime/fusion_kernel.h"

#include <torch/csrc/jit/ir/ir.h>
#include <ATen/ATen.h>
#include <c10/util/strides.h>

#include <algorithm>

#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/llga_nodes.h"
#include "jit/codegen/onednn/runtime/layouts.h"

namespace llga {

using torch::jit::TensorType;

bool FusionKernel::bind(const torch::jit::Node* node) {
  ports_ = group_partition(node);
  if (!ports_) return false;
  const GroupPartition& gp = *ports_;
  profiled_.partition = gp.partition;

  auto guarded = node->hasAttribute(kGuardedInputs) ? node->is(kGuardedInputs) : std::vector<int64_t>{};
  auto nodes = subgraph_->nodes();
  bool binary_free = std::none_of(nodes.begin(), nodes.end(), [](const Node* n) { return is_binary_op(n); });
  // An attention group (decompose_ops.cpp's SDPA: matmul, scale, mask, softmax, matmul): its binary
  // ops read the scores, never an input its matmuls read, so those (q, k and v: a projection's
  // transposed views) go to oneDNN in any dense layout, as in a group without binary ops.
  bool attention = std::any_of(nodes.begin(), nodes.end(),
                               [](const Node* n) { return onednn_kind(n) == dnnl::graph::op::kind::SoftMax; }) &&
                   std::count_if(nodes.begin(), nodes.end(),
                                 [](const Node* n) { return onednn_kind(n) == dnnl::graph::op::kind::MatMul; }) == 2;
  bool binary_chain = binary_chain_of_binaries(*subgraph_);
  // quirks::copy_matmul_post_op_operands: a matmul's post-op operand goes to oneDNN contiguous.
  bool matmul_post_ops = quirks::copy_matmul_post_op_operands() && !binary_free &&
                         std::any_of(nodes.begin(), nodes.end(),
                                     [](const Node* n) { return onednn_kind(n) == dnnl::graph::op::kind::MatMul; });
  inputs_.resize(num_inputs_);
  for (size_t i = 0; i < num_inputs_; ++i) {
    const Value* v = subgraph_->inputs()[i];
    inputs_[i].guarded = i < guarded.size() && guarded[i];
    inputs_[i].any_dense = (binary_free || attention) && read_by_conv_or_matmul_only(v);
    inputs_[i].read_by_matmul = read_by_matmul(v);
    inputs_[i].image = read_as_conv_source_only(v);
    auto read_by = [&](auto pred) { return std::any_of(v->uses().begin(), v->uses().end(), [&](const auto& u) { return pred(u.user); }); };
    inputs_[i].plain_only = binary_chain || (matmul_post_ops && read_by(is_binary_op)) ||
                            (quirks::reduction_reads_plain() && read_by([](const Node* n) { return in_family(n, kReduction); }));
    auto type = v->type()->cast<TensorType>();
    auto rank = type ? type->dim() : std::nullopt;
    inputs_[i].channels_last =
        quirks::pooling_reads_channels_last() && (rank == 3 || rank == 5) && read_by([](const Node* n) { return in_family(n, kPooling); });
  }

  auto in_lts = profiled_.partition.get_input_ports();
  for (size_t p = 0; p < in_lts.size(); ++p) {
    int64_t i = gp.input[p];
    InPort port;
    if (i >= 0) {
      port.input = static_cast<size_t>(i);
      port.sizes = *subgraph_->inputs()[i]->type()->expect<TensorType>()->sizes().concrete_sizes();
      inputs_[i].ports++;
    } else if (gp.constant[p].defined()) {
      port.constant = readable(gp.constant[p]);
      port.sizes = in_lts[p].get_dims();
    } else {
      return false;  // neither a group input nor a weight
    }
    in_ports_.push_back(std::move(port));
    profiled_.in_ids.push_back(in_lts[p].get_id());
  }

  auto opaque = node->hasAttribute(kOpaqueOutputs) ? node->is(kOpaqueOutputs) : std::vector<int64_t>{};
  output_port_.assign(subgraph_->outputs().size(), SIZE_MAX);
  auto out_lts = profiled_.partition.get_output_ports();
  for (size_t p = 0; p < out_lts.size(); ++p) {
    int64_t j = gp.output[p];
    if (j < 0) return false;  // an output no group output is
    OutPort port;
    auto t = subgraph_->outputs()[j]->type()->expect<TensorType>();
    port.dtype = *t->scalarType();
    port.sizes = *t->sizes().concrete_sizes();
    // Outputs PyTorch reads get the profiled strides (eager's memory format) when dense, else contiguous;
    // channels-last ones where only groups and elementwise ops read them (kChannelsLastOutput).
    auto strides = *t->strides().concrete_sizes();
    if (!at::empty_strided(port.sizes, strides, at::TensorOptions().device(at::kMeta)).is_non_overlapping_and_dense()) {
      auto contiguous = c10::contiguous_strides(port.sizes);
      strides.assign(contiguous.begin(), contiguous.end());
    }
    if (c10::isQIntType(port.dtype)) {
      port.qparams = quantize_params(subgraph_->outputs()[j]->node());
      if (!port.qparams) return false;
      strides = quantized_strides(port.sizes);
    }
    const int64_t layout = static_cast<size_t>(j) < opaque.size() ? opaque[j] : kStridedOutput;
    if (layout == kChannelsLastOutput && port.sizes.size() == 4 && !port.qparams) {
      auto channels_last = c10::get_channels_last_strides_2d(port.sizes);
      strides.assign(channels_last.begin(), channels_last.end());
    }
    port.opaque = layout == kOpaqueOutput && !port.qparams;
    port.strides = unit_dims_dense(port.sizes, strides);
    output_port_[j] = out_ports_.size();
    out_ports_.push_back(std::move(port));
    profiled_.out_ids.push_back(out_lts[p].get_id());
  }
  return std::find(output_port_.begin(), output_port_.end(), SIZE_MAX) == output_port_.end();  // every output a port
}

}  // namespace llga
