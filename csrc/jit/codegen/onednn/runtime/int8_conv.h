#pragma once
// An int8 convolution group run as one oneDNN convolution primitive, not through oneDNN Graph
// (int8_conv.cpp). The group (dequantize -> conv [+ bias] [-> relu/relu6/hardtanh/clamp] [+ dequantized
// residual] [-> relu/...] -> quantize) becomes the primitive oneDNN Graph would build for it: the
// same scales, zero points and post-ops (relu, clip_v2, sum), so the same kernel and the same codes. What
// it saves is oneDNN Graph's execute layer, ~1.5 us a call (its memory objects re-pointed, its
// constant cache looked up, its argument maps built), which on a MobileNetV2 of 52 such groups is
// time the second thread spends waiting.
#include <torch/csrc/jit/ir/ir.h>

#include <ATen/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace llga {

// What an int8 convolution group computes, read from its subgraph once.
struct Int8ConvSpec {
  size_t src_input = 0;                 // the group input the conv reads (through a dequantize)
  std::optional<size_t> residual_input;  // the group input added to its result (through a dequantize)
  float src_scale = 1, res_scale = 1, dst_scale = 1;
  int32_t src_zero_point = 0, res_zero_point = 0, dst_zero_point = 0;
  c10::ScalarType dst_dtype = c10::kQUInt8;
  at::Tensor weight;  // QInt8, per tensor or per output channel, zero points 0
  at::Tensor bias;    // fp32, or undefined
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  // In order: clips (relu is clip(0, inf), run as oneDNN's relu) and at most one sum (the residual).
  struct PostOp {
    bool sum = false;
    float lo = 0, hi = 0;
  };
  std::vector<PostOp> post_ops;
};

// The spec if g is exactly such a group over 4-D tensors, on a CPU whose int8 kernels have VNNI
// (without it oneDNN Graph's path keeps its quirks); nullopt otherwise.
std::optional<Int8ConvSpec> int8_conv_spec(const torch::jit::Graph& g);

// The primitive for one layout of the inputs (a compiled partition's counterpart), its weights
// reordered once. Not thread-safe: calls hold the compiled partition's execute mutex.
class Int8Conv {
 public:
  // Null, with the reason in `why`, where the inputs are no dense channels-last quantized tensors
  // of the spec's dtypes or oneDNN has no kernel for them.
  static std::unique_ptr<Int8Conv> create(const Int8ConvSpec& spec, const at::Tensor& src, const at::Tensor* residual,
                                          c10::IntArrayRef dst_sizes, std::string* why);
  ~Int8Conv();
  // dst (channels-last, dst_sizes) holds the residual's codes already when the spec has a sum.
  void execute(const void* src, void* dst);

 private:
  Int8Conv() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llga
