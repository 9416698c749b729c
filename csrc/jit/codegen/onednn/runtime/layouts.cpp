// The layouts oneDNN is handed and hands back: which input layouts it reads in place (others are
// copied first, where a quirk says it misreads them), the cache key of an input's layout, and the
// layouts of quantized outputs. Pure functions of tensors and the group's subgraph.
#include "jit/codegen/onednn/runtime/layouts.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <algorithm>
#include <numeric>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/runtime/to_dense.h"

namespace llga {

using dnnl::graph::logical_tensor;

namespace {

// Dense in this order of dims (outermost first), ignoring size-1 dims: PyTorch's own test.
bool dense_in_order(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ArrayRef<size_t> order) {
  int64_t expected = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    if (sizes[*d] == 1) continue;
    if (strides[*d] != expected) return false;
    expected *= sizes[*d];
  }
  return true;
}

// Whether a matmul reads these strides right: batch dims outermost, each matrix row- or
// column-major, or a matrix that is not square (quirks::copy_interleaved_matmul_inputs: the fault
// needs a square one; attention's q, k and v views, [L, D], are read in place unless L == D).
bool batch_dims_outside(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  const size_t r = sizes.size();
  if (r <= 2 || !quirks::copy_interleaved_matmul_inputs() || sizes[r - 1] != sizes[r - 2]) return true;
  c10::SmallVector<size_t, 8> order(r);
  std::iota(order.begin(), order.end(), size_t(0));
  if (dense_in_order(sizes, strides, order)) return true;
  std::swap(order[r - 2], order[r - 1]);
  return dense_in_order(sizes, strides, order);
}

}  // namespace

// A tensor oneDNN can read in place: LLGA, or contiguous, or channels-last; any dense layout for
// an input only convolutions and matmuls read in a group without binary ops (a transposed conv1d
// input is "nwc", the layout the convolution wants: copying it cost XML-CNN three reorders),
// except a layout a matmul reads wrongly (batch_dims_outside). Other dense layouts (a transposed
// tensor) are copied where quirks::copy_transposed_inputs() says, and every layout but the
// contiguous one (channels-last too) where plain_only (binary_chain_of_binaries).
at::Tensor readable(const at::Tensor& t, bool any_dense, bool read_by_matmul, bool plain_only) {
  if (t.is_neg() || t.is_conj()) return t.resolve_conj().resolve_neg().contiguous();  // lazy views: materialize
  if (is_llga_tensor(t)) {
    auto strides = llga_impl(t).layout_strides();  // empty: oneDNN's own opaque layout
    if (strides.empty() || !(plain_only || read_by_matmul)) return t;
    c10::SmallVector<size_t, 8> in_order(t.dim());
    std::iota(in_order.begin(), in_order.end(), size_t(0));
    bool plain = dense_in_order(t.sizes(), strides, in_order);
    if ((plain_only && !plain) || (read_by_matmul && !batch_dims_outside(t.sizes(), strides)))
      return llga_to_dense(t).contiguous();
    return t;
  }
  if (t.is_contiguous()) return t;
  if (plain_only) return t.contiguous();
  if ((t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
      (t.dim() == 5 && t.is_contiguous(at::MemoryFormat::ChannelsLast3d)))
    return t;
  if ((any_dense || !quirks::copy_transposed_inputs()) && t.is_non_overlapping_and_dense() &&
      (!read_by_matmul || batch_dims_outside(t.sizes(), t.strides())))
    return t;
  return t.contiguous();
}

// Whether v is read only as a convolution's source (see image_to_channels_last()), directly or
// through a dequantize (an int8 model's quantized input).
bool read_as_conv_source_only(const Value* v) {
  for (const auto& use : v->uses()) {
    const OpEntry* e = find_entry(use.user);
    if (e && e->kind == dnnl::graph::op::kind::Dequantize && use.offset == 0 && read_as_conv_source_only(use.user->output()))
      continue;
    if (!e || e->kind != dnnl::graph::op::kind::Convolution || use.offset != 0) return false;
  }
  return !v->uses().empty();
}

// Whether every op in the group reading v is a convolution or a matmul (see readable()).
bool read_by_conv_or_matmul_only(const Value* v) {
  for (const auto& use : v->uses())
    if (!in_family(use.user, kContraction)) return false;
  return !v->uses().empty();
}

// Whether the group's main op is a binary op with binary post-ops: no convolution or matmul, two or
// more binary ops. oneDNN 3.12 reads channels-last inputs of such a chain wrongly where a post-op
// operand broadcasts along the last dim (c + x * 2: off by up to 17; (x * b) + c crashed; fuzzing),
// so its inputs go to oneDNN contiguous (quirks::copy_transposed_inputs).
bool binary_chain_of_binaries(const torch::jit::Graph& g) {
  if (!quirks::copy_transposed_inputs()) return false;
  int binaries = 0;
  for (const Node* n : g.nodes()) {
    if (in_family(n, kContraction)) return false;
    binaries += is_binary_op(n);
  }
  return binaries >= 2;
}

// Whether a matmul in the group reads v (see readable()).
bool read_by_matmul(const Value* v) {
  for (const auto& use : v->uses()) {
    const OpEntry* e = find_entry(use.user);
    if (e && e->kind == dnnl::graph::op::kind::MatMul) return true;
  }
  return false;
}

// Strides with those of size-1 dims (which address nothing) made canonical, where
// quirks::canonical_unit_dim_strides() says: dense tensors (contiguous or channels-last) get that
// format's own strides; others the largest extent of the later dims.
std::vector<int64_t> unit_dims_dense(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  if (std::find(sizes.begin(), sizes.end(), 1) == sizes.end() || !quirks::canonical_unit_dim_strides()) return strides.vec();
  auto contiguous = [&] { auto s = c10::contiguous_strides(sizes); return std::vector<int64_t>(s.begin(), s.end()); };
  if (sizes.size() == 4 && dense_in_order(sizes, strides, {0, 1, 2, 3})) return contiguous();
  if (sizes.size() == 4 && dense_in_order(sizes, strides, {0, 2, 3, 1})) return c10::get_channels_last_strides_2d(sizes);
  if (sizes.size() == 5 && dense_in_order(sizes, strides, {0, 1, 2, 3, 4})) return contiguous();
  if (sizes.size() == 5 && dense_in_order(sizes, strides, {0, 2, 3, 4, 1})) return c10::get_channels_last_strides_3d(sizes);
  // A size-1 dim outside every later dim in memory: the next dim's extent alone could tie with
  // another dim's stride when the later dims are permuted (a transposed [2,1,1,k,2] matrix gave
  // [.., k, 1, k]), and oneDNN then misread the layout (fuzzing).
  std::vector<int64_t> r(strides.begin(), strides.end());
  for (size_t d = r.size(); d-- > 0;) {
    if (sizes[d] != 1) continue;
    int64_t outside = 1;
    for (size_t e = d + 1; e < r.size(); ++e) outside = std::max<int64_t>(outside, r[e] * std::max<int64_t>(sizes[e], 1));
    r[d] = outside;
  }
  return r;
}

void append_layout_key(c10::SmallVectorImpl<int64_t>& key, const at::Tensor& t) {
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  if (is_llga_tensor(t)) {
    const auto& d = llga_impl(t).desc();
    key.push_back(d.get_layout_type() == logical_tensor::layout_type::opaque ? static_cast<int64_t>(d.get_layout_id()) : -2);
    key.push_back(t.dim());
    for (auto s : t.sizes()) key.push_back(s);
    for (auto s : llga_impl(t).layout_strides()) key.push_back(s);  // empty if opaque
  } else {
    key.push_back(-1);
    key.push_back(t.dim());
    for (auto s : t.sizes()) key.push_back(s);
    for (auto s : t.strides()) key.push_back(s);
  }
}

// A quantized output is a PyTorch quantized tensor (what aten::dequantize or a fallback reads) with
// the scale and zero point of the Quantize that made it, never an LLGA tensor. 4-D ones are
// channels-last, the layout oneDNN's int8 convolutions read and write.
std::vector<int64_t> quantized_strides(const std::vector<int64_t>& sizes) {
  if (sizes.size() == 4) return c10::get_channels_last_strides_2d(sizes);
  auto contiguous = c10::contiguous_strides(sizes);
  return {contiguous.begin(), contiguous.end()};
}

// The layout oneDNN was asked for: channels-last (profiled sizes, quantized_strides) or contiguous
// (sizes inferred at compile time).
c10::MemoryFormat memory_format_of(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  auto contiguous = c10::contiguous_strides(sizes);
  bool is_contiguous = std::equal(strides.begin(), strides.end(), contiguous.begin(), contiguous.end());
  // (Strides of size-1 dims do not matter; oneDNN may report them either way.)
  TORCH_CHECK(is_contiguous || strides == quantized_strides(sizes) ||
                  strides == unit_dims_dense(sizes, quantized_strides(sizes)),
              "llga: unexpected quantized output layout");
  return is_contiguous ? c10::MemoryFormat::Contiguous : c10::MemoryFormat::ChannelsLast;
}

}  // namespace llga
