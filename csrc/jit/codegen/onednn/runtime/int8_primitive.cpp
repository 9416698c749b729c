// int8 convolution and linear groups as oneDNN convolution and matmul primitives (see
// int8_primitive.h): the group's subgraph read into an Int8Spec, and the primitive built, with the
// attributes oneDNN Graph gives it (scales of src, weights and dst; zero points of src and dst;
// relu, clip_v2, gelu and sum post-ops; a user scratchpad), and executed on the tensors' memory.
#include "jit/codegen/onednn/runtime/int8_primitive.h"

#include <ATen/ATen.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "onednn/torch_onednn.h"

namespace llga {

using torch::jit::Node;
using torch::jit::Value;

namespace {

std::optional<c10::IValue> constant(const Value* v) { return torch::jit::toIValue(v); }

std::optional<std::vector<int64_t>> int_list(const Value* v) {
  auto c = constant(v);
  if (!c || !c->isIntList()) return std::nullopt;
  return c->toIntVector();
}

std::optional<double> number(const Value* v) {
  auto c = constant(v);
  if (!c) return std::nullopt;
  if (c->isDouble()) return c->toDouble();
  if (c->isInt()) return static_cast<double>(c->toInt());
  return std::nullopt;
}

// The group input a dequantize (with its recorded scale and zero point) reads, read once.
struct Dequantized {
  size_t input;
  float scale;
  int32_t zero_point;
};
std::optional<Dequantized> dequantized_input(const Value* v, const torch::jit::Graph& g) {
  const Node* d = v->node();
  if (d->kind() != c10::aten::dequantize || v->uses().size() != 1 || !d->hasAttribute(kQuantScale) ||
      !d->hasAttribute(kQuantZeroPoint) || d->input(0)->node()->kind() != c10::prim::Param)
    return std::nullopt;
  auto t = d->input(0)->type()->cast<c10::TensorType>();
  if (!t || (t->scalarType() != c10::kQUInt8 && t->scalarType() != c10::kQInt8)) return std::nullopt;
  auto inputs = g.inputs();
  size_t i = std::find(inputs.begin(), inputs.end(), d->input(0)) - inputs.begin();
  return Dequantized{i, static_cast<float>(d->f(kQuantScale)), static_cast<int32_t>(d->i(kQuantZeroPoint))};
}

// The elementwise post-op n is: relu, relu6, hardtanh(lo, hi) or clamp(lo, hi) as a clip (clip(0,
// inf) runs as oneDNN's relu, the others as its clip_v2, as oneDNN Graph runs ReLU and Clamp);
// gelu (erf or tanh).
std::optional<Int8Spec::PostOp> eltwise_of(const Node* n) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  using P = Int8Spec::PostOp;
  if (n->kind() == c10::aten::relu && n->inputs().size() == 1) return P{P::kClip, 0, kInf};
  if (n->kind() == c10::aten::relu6 && n->inputs().size() == 1) return P{P::kClip, 0, 6};
  if (n->kind() == c10::aten::gelu && n->inputs().size() == 2) {
    auto approximate = constant(n->input(1));
    if (!approximate || !approximate->isString()) return std::nullopt;
    if (approximate->toStringRef() == "none") return P{P::kGelu};
    if (approximate->toStringRef() == "tanh") return P{P::kGeluTanh};
    return std::nullopt;
  }
  if ((n->kind() == c10::aten::hardtanh || n->kind() == c10::aten::clamp) && n->inputs().size() == 3) {
    auto none = [](const Value* v) { return v->type()->kind() == c10::TypeKind::NoneType; };
    auto lo = number(n->input(1)), hi = number(n->input(2));
    if ((!lo && !none(n->input(1))) || (!hi && !none(n->input(2)))) return std::nullopt;
    return P{P::kClip, lo ? static_cast<float>(*lo) : -kInf, hi ? static_cast<float>(*hi) : kInf};
  }
  return std::nullopt;
}

// The weights: a dequantize of a constant QInt8 tensor of this rank, per tensor or per output
// channel, zero points 0.
at::Tensor quantized_weight(const Value* v, int64_t rank) {
  const Node* d = v->node();
  if (d->kind() != c10::aten::dequantize || v->uses().size() != 1) return {};
  auto c = constant(d->input(0));
  if (!c || !c->isTensor()) return {};
  at::Tensor w = c->toTensor();
  if (w.scalar_type() != c10::kQInt8 || w.dim() != rank) return {};
  if (w.qscheme() == c10::kPerTensorAffine) return w.q_zero_point() == 0 ? w : at::Tensor();
  if (w.qscheme() != c10::kPerChannelAffine || w.q_per_channel_axis() != 0) return {};
  return at::all(w.q_per_channel_zero_points() == 0).item<bool>() ? w : at::Tensor();
}

// An fp32 bias of the output channels, or none.
bool read_bias(const Value* v, Int8Spec& s) {
  if (v->type()->kind() == c10::TypeKind::NoneType) return true;
  auto b = constant(v);
  if (!b || !b->isTensor() || b->toTensor().scalar_type() != c10::kFloat || b->toTensor().dim() != 1 ||
      b->toTensor().size(0) != s.weight.size(0))
    return false;
  s.bias = b->toTensor().contiguous();
  return true;
}

bool read_linear(const Node* linear, const torch::jit::Graph& g, Int8Spec& s) {
  if (linear->kind() != c10::aten::linear || linear->inputs().size() != 3) return false;
  auto src = dequantized_input(linear->input(0), g);
  s.weight = quantized_weight(linear->input(1), 2);
  if (!src || !s.weight.defined()) return false;
  s.linear = true;
  s.src_input = src->input, s.src_scale = src->scale, s.src_zero_point = src->zero_point;
  return read_bias(linear->input(2), s);
}

bool read_conv(const Node* conv, const torch::jit::Graph& g, Int8Spec& s) {
  bool full = conv->kind() == c10::aten::_convolution && conv->inputs().size() >= 12;
  if (!full && !(conv->kind() == c10::aten::conv2d && conv->inputs().size() == 7)) return false;
  auto src = dequantized_input(conv->input(0), g);
  s.weight = quantized_weight(conv->input(1), 4);
  if (!src || !s.weight.defined()) return false;
  s.src_input = src->input, s.src_scale = src->scale, s.src_zero_point = src->zero_point;
  if (!read_bias(conv->input(2), s)) return false;
  auto stride = int_list(conv->input(3)), padding = int_list(conv->input(4)), dilation = int_list(conv->input(5));
  auto groups = constant(conv->input(full ? 8 : 6));
  if (!stride || !padding || !dilation || !groups || !groups->isInt()) return false;
  if (full) {
    auto transposed = constant(conv->input(6));
    if (!transposed || !transposed->isBool() || transposed->toBool()) return false;
  }
  if (stride->size() != 2 || padding->size() != 2 || dilation->size() != 2) return false;
  s.stride = *stride, s.padding = *padding, s.dilation = *dilation, s.groups = groups->toInt();
  return s.groups >= 1 && s.weight.size(0) % s.groups == 0;
}

}  // namespace

std::optional<Int8Spec> int8_spec(const torch::jit::Graph& g) {
  if (!onednn::cpu().int8_vnni || g.outputs().size() != 1) return std::nullopt;
  auto out = g.outputs()[0]->type()->cast<c10::TensorType>();
  if (!out || !out->scalarType()) return std::nullopt;
  using P = Int8Spec::PostOp;
  Int8Spec s;
  size_t computing_nodes = 0;  // each node read below
  const Value* v = g.outputs()[0];
  if (auto qp = quantize_params(v->node())) {  // int8 out
    if (out->scalarType() != c10::kQUInt8 && out->scalarType() != c10::kQInt8) return std::nullopt;
    s.dst_scale = static_cast<float>(qp->scale), s.dst_zero_point = static_cast<int32_t>(qp->zero_point);
    s.dst_dtype = *out->scalarType();
    ++computing_nodes;
    v = v->node()->input(0);
  } else if (out->scalarType() == c10::kFloat) {  // fp32 out (a linear's)
    s.dst_dtype = c10::kFloat;
  } else {
    return std::nullopt;
  }
  // Backwards: clips and GELUs, at most one residual add, then the conv or linear.
  while (true) {
    if (v->uses().size() != 1) return std::nullopt;
    const Node* n = v->node();
    ++computing_nodes;
    if (auto op = eltwise_of(n)) {
      s.post_ops.insert(s.post_ops.begin(), *op);
      v = n->input(0);
    } else if (n->kind() == c10::aten::add && n->inputs().size() == 3 && !s.residual_input) {
      auto alpha = number(n->input(2));
      if (!alpha || *alpha != 1) return std::nullopt;
      // Either operand may be the residual: a dequantize of a group input, or (added to an fp32
      // output) an fp32 group input.
      int r = dequantized_input(n->input(0), g) ? 0 : dequantized_input(n->input(1), g) ? 1 : -1;
      if (r >= 0) {
        auto res = *dequantized_input(n->input(r), g);
        s.residual_input = res.input, s.res_scale = res.scale, s.res_zero_point = res.zero_point;
        ++computing_nodes;  // its dequantize
      } else {
        auto fp32_input = [&](const Value* x) {
          auto t = x->type()->cast<c10::TensorType>();
          return x->node()->kind() == c10::prim::Param && x->uses().size() == 1 && t && t->scalarType() == c10::kFloat;
        };
        r = fp32_input(n->input(0)) ? 0 : fp32_input(n->input(1)) ? 1 : -1;
        if (r < 0 || s.quantized_output()) return std::nullopt;
        auto inputs = g.inputs();
        s.residual_input = std::find(inputs.begin(), inputs.end(), n->input(r)) - inputs.begin();
        s.residual_fp32 = true;
      }
      s.post_ops.insert(s.post_ops.begin(), P{P::kSum});
      v = n->input(1 - r);
    } else {
      if (!(n->kind() == c10::aten::linear ? read_linear(n, g, s) : read_conv(n, g, s))) return std::nullopt;
      computing_nodes += 2;  // the dequantizes of src and weights
      break;
    }
  }
  // A conv's output is int8 (its fp32 outputs stay partitions), a linear's either.
  if (!s.linear && (!s.quantized_output() || s.residual_fp32)) return std::nullopt;
  // Nothing else in the group (constants aside). The residual may be the conv's own input
  // (conv(y) + y, which oneDNN 3.12 cannot compile as a partition): it is then copied to the output
  // before the sum, as any residual another port reads.
  size_t nodes = 0;
  for (const Node* n : g.nodes()) nodes += n->kind() != c10::prim::Constant;
  if (nodes != computing_nodes) return std::nullopt;
  return s;
}

namespace {

using dt = dnnl::memory::data_type;

dt dnnl_dtype(c10::ScalarType t) { return t == c10::kQUInt8 ? dt::u8 : dt::s8; }

// A per-tensor u8/s8 quantized tensor, dense in channels-last strides (a conv reads and writes
// them: the layout quantized group outputs have, layouts.cpp) or contiguous ones (a linear's).
bool quantized_dense(const at::Tensor& t, c10::MemoryFormat format) {
  return t.defined() && t.is_quantized() && t.qscheme() == c10::kPerTensorAffine &&
         (t.scalar_type() == c10::kQUInt8 || t.scalar_type() == c10::kQInt8) && t.storage_offset() == 0 &&
         t.is_contiguous(format);
}

// Whether the primitive reads these inputs: why not, or "".
std::string unreadable(const Int8Spec& s, const at::Tensor& src, const at::Tensor* residual, c10::IntArrayRef dst_sizes) {
  if (residual && residual->sizes() != dst_sizes) return "the residual's sizes are not the output's";
  if (!s.linear) {
    bool nhwc = src.dim() == 4 && quantized_dense(src, c10::MemoryFormat::ChannelsLast) &&
                (!residual || quantized_dense(*residual, c10::MemoryFormat::ChannelsLast));
    return nhwc && dst_sizes.size() == 4 ? "" : "an input is no dense channels-last quantized tensor";
  }
  if (src.dim() < 2 || src.dim() > 3 || dst_sizes.size() != static_cast<size_t>(src.dim()) ||
      src.size(-1) != s.weight.size(1) || !quantized_dense(src, c10::MemoryFormat::Contiguous))
    return "its src is no contiguous quantized tensor of 2 or 3 dims";
  if (residual && (s.residual_fp32 ? residual->scalar_type() != c10::kFloat || residual->is_quantized() || is_llga_tensor(*residual) ||
                                         residual->layout() != c10::kStrided || !residual->has_storage() ||
                                         residual->is_neg() || residual->is_conj() || residual->storage_offset() != 0 ||
                                         !residual->is_contiguous()
                                   : !quantized_dense(*residual, c10::MemoryFormat::Contiguous)))
    return "its residual is no contiguous tensor";
  return "";
}

dnnl::memory::desc desc(c10::IntArrayRef sizes, dt type, dnnl::memory::format_tag tag) {
  return dnnl::memory::desc({sizes.begin(), sizes.end()}, type, tag);
}

}  // namespace

struct Int8Primitive::Impl {
  dnnl::primitive primitive;
  dnnl::memory src, dst, weights, bias, scratchpad;
  dnnl::memory src_scale, weight_scales, dst_scale, src_zero_point, dst_zero_point;
  std::vector<float> scale_values;  // src, dst, then the weights'
  int32_t zero_point_values[2] = {0, 0};
  at::Tensor bias_values;
  std::vector<uint8_t> scratchpad_bytes;
  std::vector<dnnl_exec_arg_t> args;
  const void* src_handle = nullptr;  // what src and dst point at now: the buffer pool hands the same
  void* dst_handle = nullptr;        // buffers back call after call, and re-pointing has a cost
};

std::unique_ptr<Int8Primitive> Int8Primitive::create(const Int8Spec& s, const at::Tensor& src, const at::Tensor* residual,
                                                     c10::IntArrayRef dst_sizes, std::string* why) {
  *why = unreadable(s, src, residual, dst_sizes);
  if (!why->empty()) return nullptr;
  std::unique_ptr<Int8Primitive> primitive(new Int8Primitive());
  primitive->impl_ = std::make_unique<Impl>();
  Impl& m = *primitive->impl_;
  const dnnl::engine& engine = runtime::engine();
  using tag = dnnl::memory::format_tag;
  try {
    const at::Tensor& w = s.weight;
    const int64_t oc = w.size(0), g = s.groups;
    bool grouped = !s.linear && g > 1;
    bool per_channel = w.qscheme() == c10::kPerChannelAffine;

    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    // Per output channel: dim 0 of the conv's weights (dims 0 and 1 grouped), dim 1 of the matmul's [K, N].
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, !per_channel ? 0 : s.linear ? 2 : grouped ? 3 : 1);
    if (s.quantized_output()) attr.set_scales_mask(DNNL_ARG_DST, 0);
    if (s.src_zero_point != 0) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
    if (s.quantized_output() && s.dst_zero_point != 0) attr.set_zero_points_mask(DNNL_ARG_DST, 0);
    dnnl::post_ops ops;
    using P = Int8Spec::PostOp;
    for (const auto& op : s.post_ops) {
      if (op.kind == P::kSum && s.residual_fp32)
        ops.append_sum(1.f);
      else if (op.kind == P::kSum)
        ops.append_sum(s.res_scale, s.res_zero_point, dnnl_dtype(residual->scalar_type()));
      else if (op.kind == P::kGelu)
        ops.append_eltwise(dnnl::algorithm::eltwise_gelu_erf, 0, 0);
      else if (op.kind == P::kGeluTanh)
        ops.append_eltwise(dnnl::algorithm::eltwise_gelu_tanh, 0, 0);
      else if (op.lo == 0 && std::isinf(op.hi) && op.hi > 0)
        ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0, 0);  // oneDNN Graph's ReLU
      else
        ops.append_eltwise(dnnl::algorithm::eltwise_clip_v2, op.lo, op.hi);  // its Clamp
    }
    attr.set_post_ops(ops);

    dt dst_type = s.quantized_output() ? dnnl_dtype(s.dst_dtype) : dt::f32;
    dnnl::memory::desc src_md, dst_md, plain_weights_md, weights_md, bias_md;
    dnnl::primitive_desc pd;
    if (s.linear) {  // rows x K by K x N
      const int64_t k = w.size(1), rows = src.numel() / k;
      src_md = desc({rows, k}, dnnl_dtype(src.scalar_type()), tag::ab);
      dst_md = desc({rows, oc}, dst_type, tag::ab);
      plain_weights_md = desc({k, oc}, dt::s8, tag::ba);  // PyTorch's [N, K], read transposed
      if (s.bias.defined()) bias_md = desc({1, oc}, dt::f32, tag::ab);
      auto matmul = dnnl::matmul::primitive_desc(engine, src_md, desc({k, oc}, dt::s8, tag::any), bias_md, dst_md, attr);
      weights_md = matmul.weights_desc();
      m.primitive = dnnl::matmul(matmul);
      pd = matmul;
    } else {
      dnnl::memory::dims wdims = grouped ? dnnl::memory::dims{g, oc / g, w.size(1), w.size(2), w.size(3)}
                                         : dnnl::memory::dims{oc, w.size(1), w.size(2), w.size(3)};
      src_md = desc(src.sizes(), dnnl_dtype(src.scalar_type()), tag::nhwc);
      dst_md = desc(dst_sizes, dst_type, tag::nhwc);
      plain_weights_md = dnnl::memory::desc(wdims, dt::s8, grouped ? tag::goihw : tag::oihw);
      if (s.bias.defined()) bias_md = desc({oc}, dt::f32, tag::a);
      dnnl::memory::dims dilation{s.dilation[0] - 1, s.dilation[1] - 1};
      dnnl::memory::dims padding{s.padding[0], s.padding[1]};  // both sides alike, as PyTorch pads
      auto conv = dnnl::convolution_forward::primitive_desc(engine, dnnl::prop_kind::forward_inference,
                                                            dnnl::algorithm::convolution_direct, src_md,
                                                            dnnl::memory::desc(wdims, dt::s8, tag::any), bias_md, dst_md,
                                                            {s.stride[0], s.stride[1]}, dilation, padding, padding, attr);
      weights_md = conv.weights_desc();
      m.primitive = dnnl::convolution_forward(conv);
      pd = conv;
    }

    // The weights, reordered once into the kernel's layout (its compensation for zero points too).
    at::Tensor codes = w.int_repr().contiguous();
    dnnl::memory plain(plain_weights_md, engine, codes.data_ptr());
    m.weights = dnnl::memory(weights_md, engine);
    dnnl::stream& stream = runtime::stream();
    dnnl::reorder(plain, m.weights).execute(stream, plain, m.weights);
    stream.wait();

    at::Tensor wscales = per_channel ? w.q_per_channel_scales().to(c10::kFloat).contiguous()
                                     : at::full({1}, static_cast<float>(w.q_scale()), at::kFloat);
    m.scale_values = {s.src_scale, s.dst_scale};
    m.scale_values.insert(m.scale_values.end(), wscales.data_ptr<float>(), wscales.data_ptr<float>() + wscales.numel());
    auto f32 = [&](float* p, int64_t n) { return dnnl::memory({{n}, dt::f32, tag::a}, engine, p); };
    m.src_scale = f32(&m.scale_values[0], 1);
    m.dst_scale = f32(&m.scale_values[1], 1);
    m.weight_scales = f32(&m.scale_values[2], wscales.numel());
    m.zero_point_values[0] = s.src_zero_point, m.zero_point_values[1] = s.dst_zero_point;
    auto s32 = [&](int32_t* p) { return dnnl::memory({{1}, dt::s32, tag::a}, engine, p); };
    m.src_zero_point = s32(&m.zero_point_values[0]);
    m.dst_zero_point = s32(&m.zero_point_values[1]);

    m.src = dnnl::memory(src_md, engine, nullptr);
    m.dst = dnnl::memory(dst_md, engine, nullptr);
    m.args = {{DNNL_ARG_SRC, m.src.get()}, {DNNL_ARG_WEIGHTS, m.weights.get()}, {DNNL_ARG_DST, m.dst.get()},
              {DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, m.src_scale.get()},
              {DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, m.weight_scales.get()}};
    if (s.quantized_output()) m.args.push_back({DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, m.dst_scale.get()});
    if (s.bias.defined()) {
      m.bias_values = s.bias;
      m.bias = dnnl::memory(bias_md, engine, m.bias_values.data_ptr());
      m.args.push_back({DNNL_ARG_BIAS, m.bias.get()});
    }
    if (s.src_zero_point != 0) m.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, m.src_zero_point.get()});
    if (s.quantized_output() && s.dst_zero_point != 0)
      m.args.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, m.dst_zero_point.get()});
    auto scratch_md = pd.scratchpad_desc();
    if (scratch_md.get_size() > 0) {
      m.scratchpad_bytes.resize(scratch_md.get_size() + 64);
      void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(m.scratchpad_bytes.data()) + 63) & ~uintptr_t(63));
      m.scratchpad = dnnl::memory(scratch_md, engine, aligned);
      m.args.push_back({DNNL_ARG_SCRATCHPAD, m.scratchpad.get()});
    }
  } catch (const dnnl::error& e) {
    *why = std::string("oneDNN has no primitive for it (") + e.what() + ")";
    return nullptr;
  }
  return primitive;
}

Int8Primitive::~Int8Primitive() = default;

void Int8Primitive::execute(const void* src, void* dst) {
  Impl& m = *impl_;
  if (src != m.src_handle) m.src.set_data_handle(const_cast<void*>(m.src_handle = src));
  if (dst != m.dst_handle) m.dst.set_data_handle(m.dst_handle = dst);
  dnnl::error::wrap_c_api(dnnl_primitive_execute(m.primitive.get(), runtime::stream().get(), static_cast<int>(m.args.size()),
                                                 m.args.data()),
                          "could not execute an int8 convolution or linear");
}

}  // namespace llga
