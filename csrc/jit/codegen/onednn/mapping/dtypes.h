#pragma once
// The dtypes torch_llga hands to oneDNN, one row each, and what every file needs to know of them:
// the op table (which tensors map), the guards (how to scan for NaN/Inf), the kernel (what it may
// lay out), the small-graph plan (what it computes in). Adding a dtype (fp16 on CPUs whose oneDNN
// has its kernels) is one row here, plus the conditions its kernels need.
#include <c10/core/ScalarType.h>

#include <oneapi/dnnl/dnnl_graph.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace llga {

struct DtypeTraits {
  c10::ScalarType scalar;
  dnnl::graph::logical_tensor::data_type onednn;
  const char* name;  // as explain and the docs spell it
  // A floating type: it can hold NaN/Inf (the guards scan it), images of it may be laid out
  // channels-last for a convolution, the small-graph plan computes it (in fp32).
  bool floating;
  // Bit mask of the exponent in the element's bits (all ones: NaN/Inf); 0 for non-floating types.
  uint32_t exponent_mask;
  // Computed in fp32 and rounded to this type, as eager's CPU kernels do (bf16): its ops may take
  // fp32 parameters (kFloatParams) and the small-graph plan rounds each step's result.
  bool rounds_from_fp32;
  // A quantized tensor: its memory holds the int data; scale and zero point travel as op attributes,
  // and only Quantize and Dequantize may read or write it.
  bool quantized;
};

// The row of a dtype oneDNN may be handed, or null: it stays in PyTorch.
const DtypeTraits* dtype_traits(c10::ScalarType t);

// The dtypes whose tensors ops may compute on (floating ones), for messages: "float, bfloat16".
const std::string& computed_dtype_names();

// dtype_traits(t)'s oneDNN type, or nullopt.
std::optional<dnnl::graph::logical_tensor::data_type> to_dnnl_dtype(c10::ScalarType t);

// The oneDNN data type of a group input: to_dnnl_dtype's, or boolean (a Select's condition).
dnnl::graph::logical_tensor::data_type input_dtype(c10::ScalarType t);

}  // namespace llga
