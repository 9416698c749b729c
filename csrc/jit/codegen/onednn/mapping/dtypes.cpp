#include "jit/codegen/onednn/mapping/dtypes.h"

#include <c10/util/Exception.h>

namespace llga {

namespace {

using dt = dnnl::graph::logical_tensor::data_type;

//   scalar type                    oneDNN   name        floating  exponent    rounds  quantized
constexpr DtypeTraits kDtypes[] = {
    {c10::ScalarType::Float,    dt::f32, "float32",  true,  0x7f800000u, false, false},
    {c10::ScalarType::BFloat16, dt::bf16, "bfloat16", true,  0x7f80u,     true,  false},
    {c10::ScalarType::QUInt8,   dt::u8,  "quint8",   false, 0,           false, true},
    {c10::ScalarType::QInt8,    dt::s8,  "qint8",    false, 0,           false, true},
};

}  // namespace

const DtypeTraits* dtype_traits(c10::ScalarType t) {
  for (const DtypeTraits& d : kDtypes)
    if (d.scalar == t) return &d;
  return nullptr;
}

const std::string& computed_dtype_names() {
  static const std::string names = [] {
    std::string s;
    for (const DtypeTraits& d : kDtypes)
      if (d.floating) s += (s.empty() ? "" : ", ") + std::string(d.name);
    return s;
  }();
  return names;
}

std::optional<dt> to_dnnl_dtype(c10::ScalarType t) {
  const DtypeTraits* d = dtype_traits(t);
  return d ? std::optional<dt>(d->onednn) : std::nullopt;
}

dt input_dtype(c10::ScalarType t) {
  if (t == c10::ScalarType::Bool) return dt::boolean;
  auto d = to_dnnl_dtype(t);
  TORCH_CHECK(d, "torch_llga: no oneDNN type for ", c10::toString(t));
  return *d;
}

}  // namespace llga
