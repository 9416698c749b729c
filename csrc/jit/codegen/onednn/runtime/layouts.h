#pragma once
// The layouts oneDNN is handed and hands back (layouts.cpp): which input layouts it reads in place,
// the cache key of an input's layout, the layouts of quantized outputs.
#include <torch/csrc/jit/ir/ir.h>

#include <ATen/Tensor.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <vector>

namespace llga {

// t as oneDNN can read it: t itself, or a copy where oneDNN would misread t's layout (the flags are
// the group input's: FusionKernel::Input).
at::Tensor readable(const at::Tensor& t, bool any_dense = false, bool read_by_matmul = false, bool plain_only = false);

// What the group's subgraph does with an input value v, for readable() and image_to_channels_last().
bool read_as_conv_source_only(const torch::jit::Value* v);
bool read_by_conv_or_matmul_only(const torch::jit::Value* v);
bool read_by_matmul(const torch::jit::Value* v);
bool binary_chain_of_binaries(const torch::jit::Graph& g);

// Strides as oneDNN is told them: those of size-1 dims made canonical where a quirk says.
std::vector<int64_t> unit_dims_dense(c10::IntArrayRef sizes, c10::IntArrayRef strides);

// Appends t's dtype, layout (opaque layout id, or strides) and sizes: the compile cache's key, per
// input port.
void append_layout_key(c10::SmallVectorImpl<int64_t>& key, const at::Tensor& t);

// A quantized output's strides (channels-last when 4-D), and the memory format oneDNN's were.
std::vector<int64_t> quantized_strides(const std::vector<int64_t>& sizes);
c10::MemoryFormat memory_format_of(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);

}  // namespace llga
