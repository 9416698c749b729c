// onednn_attention (onednn_attention.h): the graph softmax(q k^T * scale [+ bias]) v built with
// oneDNN Graph's API for the call's sizes, one partition (oneDNN's SDPA pattern), compiled once
// per sizes and kept.
#include "jit/codegen/onednn/kernels/onednn_attention.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <oneapi/dnnl/dnnl_graph.hpp>
#include <ATen/record_function.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jit/codegen/onednn/kernels/attention_ops.h"
#include "jit/codegen/onednn/kernels/finite_scan.h"
#include "jit/codegen/onednn/settings/choices.h"
#include "onednn/buffer_pool.h"
#include "onednn/torch_onednn.h"

namespace llga {

namespace {

using dnnl::graph::logical_tensor;
using dnnl::graph::op;
using DataType = logical_tensor::data_type;

// An engine of its own with the runtime's allocator (kernels/ include nothing of runtime/): this
// partition holds no constants, so the runtime's constant-cache settings do not concern it.
dnnl::engine& engine() {
  static dnnl::engine e = dnnl::graph::make_engine_with_allocator(dnnl::engine::kind::cpu, 0,
                                                                  dnnl::graph::allocator(onednn::allocate_buffer, onednn::free_buffer));
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

struct Compiled {
  dnnl::graph::compiled_partition partition;
  std::vector<logical_tensor> inputs;  // in the partition's order
  logical_tensor output;
};

enum Id : size_t { kQ, kK, kV, kScale, kBias, kScores, kScaled, kBiased, kProbabilities, kOut };

logical_tensor described(size_t id, DataType dtype, const at::Tensor& t) {
  return logical_tensor(id, dtype, t.sizes().vec(), t.strides().vec());
}

// The partition for these tensors, or nullptr where oneDNN makes no single partition of it.
std::shared_ptr<Compiled> compiled(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor* bias,
                                   const at::Tensor& scale, const at::Tensor& out) {
  const DataType dtype = q.scalar_type() == at::kBFloat16 ? DataType::bf16 : DataType::f32;
  const std::vector<int64_t> scores = {q.size(0), q.size(1), q.size(2), k.size(2)};
  const logical_tensor lq = described(kQ, dtype, q), lk = described(kK, dtype, k), lv = described(kV, dtype, v),
                       lscale = described(kScale, dtype, scale), lout = described(kOut, dtype, out);
  const auto strides = c10::contiguous_strides(scores);
  auto intermediate = [&](size_t id) { return logical_tensor(id, dtype, scores, {strides.begin(), strides.end()}); };
  dnnl::graph::graph g(dnnl::engine::kind::cpu);
  op product(0, op::kind::MatMul, {lq, lk}, {intermediate(kScores)}, "scores");
  product.set_attr<bool>(op::attr::transpose_b, true);
  g.add_op(product);
  g.add_op(op(1, op::kind::Multiply, {intermediate(kScores), lscale}, {intermediate(kScaled)}, "scale"));
  size_t last = kScaled;
  if (bias) {
    g.add_op(op(2, op::kind::Add, {intermediate(kScaled), described(kBias, dtype, *bias)}, {intermediate(kBiased)}, "mask"));
    last = kBiased;
  }
  op softmax(3, op::kind::SoftMax, {intermediate(last)}, {intermediate(kProbabilities)}, "softmax");
  softmax.set_attr<int64_t>(op::attr::axis, -1);
  if (bias) softmax.set_attr<std::string>(op::attr::mode, "inf_as_zero");
  g.add_op(softmax);
  g.add_op(op(4, op::kind::MatMul, {intermediate(kProbabilities), lv}, {lout}, "weighted"));
  g.finalize();
  auto partitions = g.get_partitions();
  if (partitions.size() != 1 || !partitions[0].is_supported()) return nullptr;
  auto c = std::make_shared<Compiled>();
  for (const logical_tensor& port : partitions[0].get_input_ports()) {
    switch (port.get_id()) {
      case kQ: c->inputs.push_back(lq); break;
      case kK: c->inputs.push_back(lk); break;
      case kV: c->inputs.push_back(lv); break;
      case kScale: c->inputs.push_back(lscale); break;
      case kBias: c->inputs.push_back(described(kBias, dtype, *bias)); break;
      default: return nullptr;  // an intermediate as an input: not one fused partition
    }
  }
  c->output = lout;
  c->partition = partitions[0].compile(c->inputs, {lout}, engine());
  return c;
}

// Sizes and strides of every tensor of a call, and the dtype: the partition's key.
std::vector<int64_t> key_of(std::initializer_list<const at::Tensor*> tensors) {
  std::vector<int64_t> key;
  for (const at::Tensor* t : tensors) {
    if (!t) {
      key.push_back(-1);
      continue;
    }
    key.push_back(static_cast<int64_t>(t->scalar_type()));
    key.insert(key.end(), t->sizes().begin(), t->sizes().end());
    key.insert(key.end(), t->strides().begin(), t->strides().end());
  }
  return key;
}

}  // namespace

std::optional<at::Tensor> onednn_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const std::optional<at::Tensor>& mask, std::optional<double> scale,
                                           AttentionLayout layout) {
  const auto dtype = q.scalar_type();
  auto fits = [&](const at::Tensor& t) {
    return t.dim() == 4 && t.scalar_type() == dtype && t.device().is_cpu() && t.layout() == c10::kStrided &&
           !t.requires_grad() && t.numel() > 0;
  };
  if (!onednn::load_error().empty() || (dtype != at::kFloat && !(dtype == at::kBFloat16 && onednn::cpu().bf16)) || !fits(q) ||
      !fits(k) || !fits(v) || k.size(3) != q.size(3) || v.size(2) != k.size(2) || q.size(0) != k.size(0) ||
      q.size(1) != k.size(1) || v.size(0) != k.size(0) || v.size(1) != k.size(1) ||
      (mask && (mask->dim() != 4 || !mask->device().is_cpu())))
    return std::nullopt;
  // Every operand dense and contiguous: oneDNN misreads some strided layouts a graph's tensors can
  // have (odd strides of size-1 dims, square matrices with the heads between their rows and columns:
  // onednn_quirks.cpp), which the fused groups work around and this kernel need not meet. A view of
  // a projection's heads costs one copy here.
  const at::Tensor qd = q.contiguous(), kd = k.contiguous(), vd = v.contiguous();
  // NaN or Inf in q, k or v, or NaN or +Inf in a float mask: PyTorch's kernel says what they become.
  auto finite = [](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat ? all_finite(t.const_data_ptr<float>(), t.numel())
                                         : all_finite(t.const_data_ptr<c10::BFloat16>(), t.numel());
  };
  if (!finite(qd) || !finite(kd) || !finite(vd)) return std::nullopt;
  at::Tensor bias;
  if (mask) {
    bias = mask->scalar_type() == at::kBool ? attention_bias(*mask, dtype) : mask->contiguous();
    if (bias.scalar_type() != dtype) return std::nullopt;
    if (mask->scalar_type() != at::kBool && (at::isnan(bias).any().item<bool>() || at::isposinf(bias).any().item<bool>()))
      return std::nullopt;
  }
  // [B, L, H, D] memory where the heads are merged next (with one head, the same memory as contiguous:
  // allocated contiguous, so no size-1 dim has an odd stride).
  const bool merged = layout == AttentionLayout::kMergedHeads && q.size(1) > 1;
  at::Tensor out = merged ? at::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.options()).transpose(1, 2)
                          : at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  const at::Tensor factor = at::full({1, 1, 1, 1}, scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))), q.options());
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, std::shared_ptr<Compiled>> cache;  // a failed compilation: nullptr
  static std::vector<std::vector<int64_t>> order;                         // the keys, oldest first
  const std::vector<int64_t> key = key_of({&qd, &kd, &vd, mask ? &bias : nullptr, &out});
  std::shared_ptr<Compiled> c;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if ((known = it != cache.end())) c = it->second;
  }
  try {
    if (!known) {  // compiled outside the lock: another thread's call of another size goes on
      try {
        c = compiled(qd, kd, vd, mask ? &bias : nullptr, factor, out);
      } catch (const std::exception& e) {  // dnnl::error, or std::out_of_range from oneDNN's pattern matcher
        GRAPH_DEBUG("oneDNN did not compile the attention (", e.what(), ")");
        c = nullptr;
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (cache.emplace(key, c).second) {
        order.push_back(key);
        if (order.size() > kOnednnAttentionCapacity) {  // the oldest size goes
          cache.erase(order.front());
          order.erase(order.begin());
        }
      }
    }
    if (!c) return std::nullopt;
    std::vector<dnnl::graph::tensor> inputs;
    inputs.reserve(c->inputs.size());
    for (const logical_tensor& lt : c->inputs) {
      const at::Tensor& t = lt.get_id() == kQ ? qd : lt.get_id() == kK ? kd : lt.get_id() == kV ? vd : lt.get_id() == kScale ? factor : bias;
      inputs.emplace_back(lt, engine(), const_cast<void*>(t.const_data_ptr()));
    }
    dnnl::graph::tensor output(c->output, engine(), out.mutable_data_ptr());
    c->partition.execute(stream(), inputs, {output});
  } catch (const std::exception& e) {
    GRAPH_DEBUG("oneDNN did not run the attention (", e.what(), ")");
    return std::nullopt;
  }
  // Scores that overflowed (finite inputs, a non-finite result): PyTorch's kernel says what they become.
  if (!finite(out)) return std::nullopt;
  return out;
}

namespace {

at::Tensor long_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                          bool merged_heads) {
  const AttentionLayout layout = merged_heads ? AttentionLayout::kMergedHeads : AttentionLayout::kContiguous;
  auto pytorch = [&] { return reference_attention(q, k, v, std::nullopt, scale, layout); };
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return pytorch();  // and its own errors
  static choices::Chooser<at::Tensor> chooser("long_attention");
  const choices::Key key{static_cast<int64_t>(q.scalar_type()), q.size(0) * q.size(1), choices::bucket(q.size(2)),
                         choices::bucket(k.size(2)), q.size(3), v.size(3), merged_heads};
  auto describe = [&] {
    return std::pair{std::string("llga::long_attention"), c10::str(q.sizes(), " x ", k.size(2), " keys ", q.scalar_type())};
  };
  return chooser.run(key, describe, [&](size_t i) {
    if (i == 1)
      if (auto out = onednn_attention(q, k, v, std::nullopt, scale, layout)) return *out;
    return pytorch();
  });
}

torch::jit::RegisterOperators registered({torch::jit::Operator(
    "llga::long_attention(Tensor query, Tensor key, Tensor value, float? scale, bool merged_heads) -> Tensor",
    [](torch::jit::Stack& stack) {
      RECORD_FUNCTION("llga::long_attention", c10::ArrayRef<const c10::IValue>{});  // its own event in torch.profiler
      bool merged_heads = torch::jit::pop(stack).toBool();
      auto scale = torch::jit::pop(stack).toOptional<double>();
      at::Tensor v = torch::jit::pop(stack).toTensor();
      at::Tensor k = torch::jit::pop(stack).toTensor();
      at::Tensor q = torch::jit::pop(stack).toTensor();
      torch::jit::push(stack, long_attention(q, k, v, scale, merged_heads));
    },
    c10::AliasAnalysisKind::FROM_SCHEMA)});

}  // namespace

}  // namespace llga
