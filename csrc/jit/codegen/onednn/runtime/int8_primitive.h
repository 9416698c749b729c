#pragma once
// An int8 convolution or linear group run as one oneDNN primitive, not through oneDNN Graph
// (int8_primitive.cpp). The group (dequantize -> conv or linear [+ bias] [-> relu/relu6/hardtanh/
// clamp/gelu] [+ residual] [-> ...] [-> quantize]) becomes the primitive oneDNN Graph would build
// for it: the same scales, zero points and post-ops (relu, clip_v2, gelu, sum), so the same kernel
// and the same results. What it saves is oneDNN Graph's execute layer, 1.5-5 us a call (its memory
// objects re-pointed, its constant cache looked up, its argument maps built), which on a
// MobileNetV2 of 52 int8 conv groups is time the second thread spends waiting.
#include <torch/csrc/jit/ir/ir.h>

#include <ATen/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace llga {

// What an int8 convolution or linear group computes, read from its subgraph once.
struct Int8Spec {
  bool linear = false;                   // aten::linear (a matmul primitive), else a 2-D convolution
  size_t src_input = 0;                  // the group input the conv or linear reads (through a dequantize)
  std::optional<size_t> residual_input;  // the group input added to its result
  bool residual_fp32 = false;            // ... as fp32 (a linear's fp32 output), else through a dequantize
  float src_scale = 1, res_scale = 1, dst_scale = 1;
  int32_t src_zero_point = 0, res_zero_point = 0, dst_zero_point = 0;
  c10::ScalarType dst_dtype = c10::kQUInt8;  // QUInt8/QInt8 (a quantize ends the group), or Float
  at::Tensor weight;  // QInt8, per tensor or per output channel, zero points 0
  at::Tensor bias;    // fp32, or undefined
  std::vector<int64_t> stride, padding, dilation;  // a conv's
  int64_t groups = 1;
  // In order: clips (relu is clip(0, inf), run as oneDNN's relu), GELUs and at most one sum (the
  // residual).
  struct PostOp {
    enum Kind { kClip, kGelu, kGeluTanh, kSum } kind = kClip;
    float lo = 0, hi = 0;
  };
  std::vector<PostOp> post_ops;
  bool quantized_output() const { return dst_dtype != c10::kFloat; }
};

// The spec if g is exactly such a group (a conv over 4-D tensors with an int8 output, or a linear
// with an int8 or fp32 output), on a CPU whose int8 kernels have VNNI (without it oneDNN Graph's
// path keeps its quirks); nullopt otherwise.
std::optional<Int8Spec> int8_spec(const torch::jit::Graph& g);

// The primitive for one layout of the inputs (a compiled partition's counterpart), its weights
// reordered once. Not thread-safe: calls hold the compiled partition's execute mutex.
class Int8Primitive {
 public:
  // Null, with the reason in `why`, where the inputs are not what the primitive reads (a conv's:
  // dense channels-last quantized tensors; a linear's: contiguous ones, its fp32 residual a plain
  // contiguous tensor) or oneDNN has no kernel for them. dst: channels-last (a conv's) or contiguous.
  static std::unique_ptr<Int8Primitive> create(const Int8Spec& spec, const at::Tensor& src, const at::Tensor* residual,
                                               c10::IntArrayRef dst_sizes, std::string* why);
  ~Int8Primitive();
  // dst (channels-last for a conv, contiguous for a linear) holds the residual already when the
  // spec has a sum.
  void execute(const void* src, void* dst);

 private:
  Int8Primitive() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llga
