#pragma once
// When a fused output may be computed in an input's memory (inplace.cpp).
#include <ATen/core/ivalue.h>
#include <ATen/Tensor.h>
#include <oneapi/dnnl/dnnl_graph.hpp>

namespace llga {

// Whether input t (from stack slot arg; guarded: a guard's output) may become output lt, computed
// in its memory: an LLGA tensor in lt's very layout that nothing but this call holds.
bool reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const dnnl::graph::logical_tensor& lt);

}  // namespace llga
