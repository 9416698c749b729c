#include "jit/codegen/onednn/mapping/op_table.h"

#include "jit/codegen/onednn/mapping/onednn_quirks.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace llga {

using torch::jit::TensorType;
using torch::jit::toIValue;
using K = op::kind;
using A = op::attr;
using Ints = std::vector<int64_t>;

namespace {

// ---- reading constant arguments off a node -------------------------------------------------
std::optional<c10::IValue> arg(const Node* n, size_t i) { return toIValue(n->input(i)); }
bool is_none(const Node* n, size_t i) { auto v = arg(n, i); return v && v->isNone(); }
std::optional<int64_t> int_arg(const Node* n, size_t i) {
  auto v = arg(n, i);
  return v && v->isInt() ? std::optional<int64_t>(v->toInt()) : std::nullopt;
}
std::optional<double> scalar_arg(const Node* n, size_t i) {
  auto v = arg(n, i);
  if (v && v->isInt()) return static_cast<double>(v->toInt());
  if (v && v->isDouble()) return v->toDouble();
  return std::nullopt;
}
std::optional<bool> bool_arg(const Node* n, size_t i) {
  auto v = arg(n, i);
  return v && v->isBool() ? std::optional<bool>(v->toBool()) : std::nullopt;
}
std::optional<Ints> ints_arg(const Node* n, size_t i) {
  auto v = arg(n, i);
  return v && v->isIntList() ? std::optional<Ints>(v->toIntVector()) : std::nullopt;
}
std::optional<std::string> str_arg(const Node* n, size_t i) {
  auto v = arg(n, i);
  return v && v->isString() ? std::optional<std::string>(v->toStringRef()) : std::nullopt;
}

int64_t rank(const Value* v) {
  auto t = v->type()->cast<TensorType>();
  return t && t->dim() ? static_cast<int64_t>(*t->dim()) : -1;
}
Ints sizes(const Value* v) {
  auto s = v->type()->expect<TensorType>()->sizes().concrete_sizes();
  return s ? *s : Ints{};
}
int64_t wrap_dim(int64_t d, int64_t r) { return d < 0 ? d + r : d; }

// A pooling/conv list argument as n spatial values: PyTorch allows one value for all dims.
std::optional<Ints> spatial(std::optional<Ints> v, size_t n) {
  if (!v) return std::nullopt;
  if (v->size() == 1 && n > 1) return Ints(n, (*v)[0]);
  return v->size() == n ? v : std::nullopt;
}

// ---- builders: one per family of ops -------------------------------------------------------
bool unary(const Node* n, OpSpec& s) { s.in(n->input(0)); return true; }
bool binary(const Node* n, OpSpec& s) { s.in(n->input(0)).in(n->input(1)); return true; }

// Binary ops oneDNN computes wrongly as post-ops there, or only with a reference kernel
// (onednn_quirks.h), stay in PyTorch.
bool unsafe_post_op(const Node* n) {
  return quirks::matmul_last_dim_broadcast_post_op(n) || quirks::one_element_layer_norm_post_op(n) ||
         quirks::linear_4d_broadcast_post_op(n) || quirks::matmul_per_batch_column_post_op(n) ||
         quirks::conv_per_sample_post_op(n) || quirks::conv_spatial_broadcast_post_op(n) ||
         quirks::layer_norm_4d_last_dim_broadcast_post_op(n) || quirks::one_row_matmul_sum_post_op(n);
}
bool elementwise_binary(const Node* n, OpSpec& s) { return !unsafe_post_op(n) && binary(n, s); }
bool binary_alpha(const Node* n, OpSpec& s) {  // add/sub: alpha != 1 is split out by prepare_binary
  auto alpha = scalar_arg(n, 2);
  return alpha && *alpha == 1 && elementwise_binary(n, s);
}

// Where a transposed convolution's arguments are (aten::_convolution's order differs from conv_transpose2d's).
struct ConvTransposeArgs {
  size_t stride, padding, output_padding, groups, dilation;
};

// ConvTranspose: PyTorch's weight [in, out / groups, k...] is oneDNN's IOX, and both size the output
// (in - 1) * stride - 2 * pad + dilation * (k - 1) + output_padding + 1.
bool conv_transpose(const Node* n, OpSpec& s, ConvTransposeArgs a) {
  int64_t r = rank(n->input(0));
  if (r < 3 || r > 5 || rank(n->input(1)) != r) return false;
  size_t sp = static_cast<size_t>(r - 2);
  auto stride = spatial(ints_arg(n, a.stride), sp), pad = spatial(ints_arg(n, a.padding), sp);
  auto out_pad = spatial(ints_arg(n, a.output_padding), sp), dil = spatial(ints_arg(n, a.dilation), sp);
  auto groups = int_arg(n, a.groups);
  if (!stride || !pad || !out_pad || !dil || !groups || *groups < 1) return false;
  s.kind = K::ConvTranspose;
  s.in(n->input(0)).in(n->input(1));
  if (!is_none(n, 2)) {
    if (rank(n->input(2)) != 1) return false;
    s.in(n->input(2));
  }
  s.attr(A::strides, *stride).attr(A::pads_begin, *pad).attr(A::pads_end, *pad).attr(A::dilations, *dil)
      .attr(A::output_padding, *out_pad).attr(A::groups, *groups).attr(A::data_format, std::string("NCX"))
      .attr(A::weights_format, std::string("IOX"));
  return true;
}

bool convolution(const Node* n, OpSpec& s, bool has_transposed_arg) {
  int64_t r = rank(n->input(0));
  if (r < 3 || rank(n->input(1)) != r) return false;
  size_t sp = static_cast<size_t>(r - 2);
  auto stride = spatial(ints_arg(n, 3), sp), pad = spatial(ints_arg(n, 4), sp), dil = spatial(ints_arg(n, 5), sp);
  auto groups = int_arg(n, has_transposed_arg ? 8 : 6);
  auto transposed = has_transposed_arg ? bool_arg(n, 6) : std::optional<bool>(false);
  if (!transposed) return false;
  if (*transposed) return conv_transpose(n, s, {3, 4, 7, 8, 5});
  if (!stride || !pad || !dil || !groups || quirks::one_channel_unit_width_conv(n, *stride)) return false;
  if (quirks::dilated_unit_kernel()) {  // a size-1 kernel dim reads one pixel whatever its dilation
    Ints w = sizes(n->input(1));
    for (size_t i = 0; i < sp && w.size() == sp + 2; ++i)
      if (w[2 + i] == 1) (*dil)[i] = 1;
  }
  s.in(n->input(0)).in(n->input(1));
  if (!is_none(n, 2)) {
    if (rank(n->input(2)) != 1) return false;
    s.in(n->input(2));
  }
  s.attr(A::strides, *stride).attr(A::pads_begin, *pad).attr(A::pads_end, *pad).attr(A::dilations, *dil)
      .attr(A::groups, *groups).attr(A::data_format, std::string("NCX")).attr(A::weights_format, std::string("OIX"));
  return true;
}

bool batch_norm(const Node* n, OpSpec& s) {
  if (bool_arg(n, 5).value_or(true) || rank(n->input(0)) < 2) return false;  // inference only
  for (size_t i = 1; i <= 4; ++i)
    if (is_none(n, i) || rank(n->input(i)) != 1) return false;
  auto eps = scalar_arg(n, 7);
  if (!eps) return false;
  for (size_t i = 0; i <= 4; ++i) s.in(n->input(i));  // src, gamma, beta, mean, variance
  s.attr(A::epsilon, static_cast<float>(*eps)).attr(A::data_format, std::string("NCX"));
  return true;
}

// group_norm(input, num_groups, weight, bias, eps): channels (dim 1) in groups; gamma and beta both or neither.
bool group_norm(const Node* n, OpSpec& s) {
  int64_t r = rank(n->input(0));
  auto groups = int_arg(n, 1);
  auto eps = scalar_arg(n, 4);
  if (quirks::group_norm_slow_kernel(n)) return s.refuse("oneDNN's group norm is slower than PyTorch's (quirk group_norm_slow_kernel)");
  if (r < 3 || r > 5 || !groups || !eps || *groups < 1 || sizes(n->input(0))[1] % *groups) return false;
  bool affine = !is_none(n, 2) && !is_none(n, 3);
  if (!affine && !(is_none(n, 2) && is_none(n, 3))) return false;
  s.in(n->input(0));
  if (affine) {
    if (rank(n->input(2)) != 1 || rank(n->input(3)) != 1) return false;
    s.in(n->input(2)).in(n->input(3));
  }
  s.attr(A::groups, *groups).attr(A::use_affine, affine).attr(A::keep_stats, false)
      .attr(A::epsilon, static_cast<float>(*eps)).attr(A::data_format, std::string("NCX"));
  return true;
}

bool linear(const Node* n, OpSpec& s) {
  if (rank(n->input(0)) < 2 || rank(n->input(1)) != 2 || quirks::matrix_vector_product(n)) return false;
  s.in(n->input(0)).in(n->input(1));
  if (!is_none(n, 2)) {
    if (rank(n->input(2)) != 1) return false;
    s.in(n->input(2));
  }
  s.attr(A::transpose_b, true);
  return true;
}

bool matmul(const Node* n, OpSpec& s) {
  // 1-D operands have vector semantics in PyTorch; leave them to PyTorch.
  int64_t ra = rank(n->input(0)), rb = rank(n->input(1));
  if (ra < 2 || rb < 2 || ra != rb || quirks::matrix_vector_product(n)) return false;
  return binary(n, s);
}

bool clamp_to(OpSpec& s, Value* x, double lo, double hi) {
  s.in(x).attr(A::min, static_cast<float>(lo)).attr(A::max, static_cast<float>(hi));
  return true;
}

bool clamp(const Node* n, OpSpec& s) {
  constexpr double inf = std::numeric_limits<float>::infinity();
  auto lo = is_none(n, 1) ? std::optional<double>(-inf) : scalar_arg(n, 1);
  auto hi = is_none(n, 2) ? std::optional<double>(inf) : scalar_arg(n, 2);
  return lo && hi && *lo <= *hi && clamp_to(s, n->input(0), *lo, *hi);
}

bool hardtanh(const Node* n, OpSpec& s) {
  auto lo = scalar_arg(n, 1), hi = scalar_arg(n, 2);
  return lo && hi && *lo <= *hi && clamp_to(s, n->input(0), *lo, *hi);
}

bool elu(const Node* n, OpSpec& s) {
  auto alpha = scalar_arg(n, 1), scale = scalar_arg(n, 2), input_scale = scalar_arg(n, 3);
  if (!alpha || scale.value_or(0) != 1 || input_scale.value_or(0) != 1) return false;
  s.in(n->input(0)).attr(A::alpha, static_cast<float>(*alpha));
  return true;
}

bool leaky_relu(const Node* n, OpSpec& s) {
  auto slope = scalar_arg(n, 1);
  if (!slope) return false;
  s.in(n->input(0)).attr(A::alpha, static_cast<float>(*slope));
  return true;
}

bool gelu(const Node* n, OpSpec& s) {
  if (quirks::gelu_post_op_slow(n)) return s.refuse("oneDNN's GELU post-op of a matmul is slower than PyTorch's GELU on AVX2 (quirk gelu_post_op_slow)");
  auto approximate = str_arg(n, 1);
  if (approximate == "tanh") s.attr(A::mode, std::string("gelu_tanh"));  // default: "gelu_erf"
  else if (approximate != "none") return false;
  return unary(n, s);
}

bool round(const Node* n, OpSpec& s) { return !quirks::bf16_round(n) && unary(n, s); }

bool pow_scalar(const Node* n, OpSpec& s) {
  auto e = scalar_arg(n, 1);
  if (!e) return false;
  s.in(n->input(0));
  // oneDNN v3.2 fuses no Pow partition; the two common exponents have ops of their own, which
  // compute what PyTorch's pow does for them (x*x and sqrt).
  if (*e == 2.0 && quirks::enabled("pow_as_square_sqrt")) s.kind = K::Square;
  else if (*e == 0.5 && quirks::enabled("pow_as_square_sqrt")) s.kind = K::Sqrt;
  else s.attr(A::beta, static_cast<float>(*e));
  return true;
}

bool softmax(const Node* n, OpSpec& s) {
  auto dim = int_arg(n, 1);
  if (!dim || !is_none(n, 2)) return false;
  s.in(n->input(0)).attr(A::axis, wrap_dim(*dim, rank(n->input(0))));
  return true;
}

bool softmax_inf_as_zero(const Node* n, OpSpec& s) {  // decompose_ops.cpp: rows of only -inf give 0
  auto dim = int_arg(n, 1);
  if (!dim) return false;
  s.in(n->input(0)).attr(A::axis, wrap_dim(*dim, rank(n->input(0)))).attr(A::mode, std::string("inf_as_zero"));
  return true;
}

bool layer_norm(const Node* n, OpSpec& s) {
  auto shape = ints_arg(n, 1);
  auto eps = scalar_arg(n, 4);
  if (!shape || !eps || shape->size() != 1) return false;
  bool affine = !is_none(n, 2) && !is_none(n, 3);
  if (!affine && !(is_none(n, 2) && is_none(n, 3))) return false;
  s.in(n->input(0));
  if (affine) s.in(n->input(2)).in(n->input(3));
  s.shape_specific = !affine;  // PyTorch checks the input against normalized_shape; without weights oneDNN would not
  s.attr(A::begin_norm_axis, int64_t{-1}).attr(A::use_affine, affine).attr(A::keep_stats, false)
      .attr(A::epsilon, static_cast<float>(*eps));
  return true;
}

// RMSNorm over the last dimension (oneDNN's RMSNorm, 3.11+): x / sqrt(mean(x^2) + eps) * weight.
// eps None is the input type's machine epsilon: mapped for fp32 inputs only (FLT_EPSILON).
bool rms_norm(const Node* n, OpSpec& s) {
  auto shape = ints_arg(n, 1);
  if (!shape || shape->size() != 1) return false;
  std::optional<double> eps = scalar_arg(n, 3);
  if (is_none(n, 3)) {
    auto t = n->input(0)->type()->cast<TensorType>();
    if (!t || t->scalarType() != c10::kFloat) return false;
    eps = std::numeric_limits<float>::epsilon();
  }
  if (!eps) return false;
  bool affine = !is_none(n, 2);
  s.in(n->input(0));
  if (affine) s.in(n->input(2));
  s.shape_specific = !affine;  // PyTorch checks the input against normalized_shape; without weights oneDNN would not
  s.attr(A::begin_norm_axis, int64_t{-1}).attr(A::epsilon, static_cast<float>(*eps));  // gamma given or not: no use_affine
  return true;
}

// oneDNN's pooling output size; the mapping holds only where it equals PyTorch's (ceil_mode edge cases differ).
bool pool_shape_matches(const Node* n, const Ints& k, const Ints& st, const Ints& pad, const Ints& dil, bool ceil) {
  Ints in = sizes(n->input(0)), out = sizes(n->output());
  for (size_t i = 0; i < k.size(); ++i) {
    double span = static_cast<double>(in[2 + i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) / st[i];
    int64_t o = static_cast<int64_t>(ceil ? std::ceil(span) : std::floor(span)) + 1;
    if (o != out[2 + i]) return false;
  }
  return true;
}

template <size_t Dims>
bool max_pool(const Node* n, OpSpec& s) {
  if (rank(n->input(0)) != static_cast<int64_t>(Dims) + 2) return false;
  if (quirks::pooling_of_a_plain_input(n))
    return s.refuse("a 1-D or 3-D pooling no fused op feeds: slower in oneDNN (quirk pooling_reads_channels_last)");
  auto k = spatial(ints_arg(n, 1), Dims), pad = spatial(ints_arg(n, 3), Dims), dil = spatial(ints_arg(n, 4), Dims);
  auto st = ints_arg(n, 2);
  auto ceil = bool_arg(n, 5);
  if (st && st->empty()) st = k;
  st = spatial(st, Dims);
  if (!k || !st || !pad || !dil || !ceil || !pool_shape_matches(n, *k, *st, *pad, *dil, *ceil)) return false;
  s.shape_specific = s.spatial_only = *ceil;  // ceil_mode output sizes agree with PyTorch's only where checked
  s.in(n->input(0)).attr(A::kernel, *k).attr(A::strides, *st).attr(A::pads_begin, *pad).attr(A::pads_end, *pad)
      .attr(A::dilations, *dil).attr(A::rounding_type, std::string(*ceil ? "ceil" : "floor"))
      .attr(A::data_format, std::string("NCX"));
  return true;
}

template <size_t Dims>
bool avg_pool(const Node* n, OpSpec& s) {
  if (rank(n->input(0)) != static_cast<int64_t>(Dims) + 2) return false;
  if (quirks::pooling_of_a_plain_input(n))
    return s.refuse("a 1-D or 3-D pooling no fused op feeds: slower in oneDNN (quirk pooling_reads_channels_last)");
  auto k = spatial(ints_arg(n, 1), Dims), pad = spatial(ints_arg(n, 3), Dims);
  auto st = ints_arg(n, 2);
  auto ceil = bool_arg(n, 4), count_include_pad = bool_arg(n, 5);
  if (st && st->empty()) st = k;
  st = spatial(st, Dims);
  // ceil_mode changes PyTorch's divisor at the border; divisor_override (not in avg_pool1d) has no oneDNN form.
  bool divisor_override = n->inputs().size() > 6 && !is_none(n, 6);
  if (!k || !st || !pad || ceil.value_or(true) || !count_include_pad || divisor_override) return false;
  if (!pool_shape_matches(n, *k, *st, *pad, Ints(Dims, 1), false)) return false;
  s.in(n->input(0)).attr(A::kernel, *k).attr(A::strides, *st).attr(A::pads_begin, *pad).attr(A::pads_end, *pad)
      .attr(A::exclude_pad, !*count_include_pad).attr(A::rounding_type, std::string("floor"))
      .attr(A::data_format, std::string("NCX"));
  return true;
}

// adaptive_avg_pool2d is an average pool where the output size divides the input's: PyTorch's
// windows are then [i * k, (i + 1) * k), kernel and stride k = in / out (to 1x1: the whole input;
// not ReduceMean: v3.2 reduced a convolution's channels-last or blocked output with its reference
// kernel, 2 ms for one of MobileNetV3's). The kernel is the profiled size: other sizes run unfused.
bool adaptive_avg_pool(const Node* n, OpSpec& s) {
  auto out = spatial(ints_arg(n, 1), 2);
  if (rank(n->input(0)) != 4 || !out) return false;
  if (*out == Ints{1, 1} && !quirks::enabled("global_avg_pool_as_avg_pool"))  // a mean over H and W
    return s.kind = K::ReduceMean, s.in(n->input(0)).attr(A::axes, Ints{2, 3}).attr(A::keep_dims, true), true;
  Ints in = sizes(n->input(0));  // unprofiled (a loop's varying sizes): empty
  if (in.size() != 4 || (*out)[0] < 1 || (*out)[1] < 1 || in[2] % (*out)[0] || in[3] % (*out)[1])
    return s.refuse("adaptive average pooling to a size that does not divide the input's (uneven windows)");
  Ints k{in[2] / (*out)[0], in[3] / (*out)[1]};
  s.shape_specific = s.spatial_only = true;  // the windows: the profiled H and W
  s.in(n->input(0)).attr(A::kernel, k).attr(A::strides, k).attr(A::pads_begin, Ints{0, 0})
      .attr(A::pads_end, Ints{0, 0}).attr(A::exclude_pad, false).attr(A::rounding_type, std::string("floor"))
      .attr(A::data_format, std::string("NCX"));
  return true;
}

// mean.dim / sum.dim_IntList (dim, keepdim, dtype), amax / amin (dim, keepdim): no dims is all dims in
// PyTorch (an empty axes list is no reduction in oneDNN).
bool reduce(const Node* n, OpSpec& s) {
  int64_t r = rank(n->input(0));
  auto dims = is_none(n, 1) ? std::optional<Ints>(Ints{}) : ints_arg(n, 1);
  auto keepdim = bool_arg(n, 2);
  if (r < 1 || !dims || !keepdim || (n->inputs().size() > 3 && !is_none(n, 3))) return false;  // dtype: not mapped
  Ints axes;
  for (int64_t d = 0; d < r; ++d)
    if (dims->empty() || std::any_of(dims->begin(), dims->end(), [&](int64_t e) { return wrap_dim(e, r) == d; }))
      axes.push_back(d);
  if (quirks::reduction_of_outer_dims(axes, r))
    return s.refuse("a reduction over outer dims: oneDNN's reference kernel (quirk reduction_reads_plain)");
  Ints in = sizes(n->input(0));
  if (static_cast<int64_t>(in.size()) != r) return false;  // not profiled
  int64_t reduced = 1;
  for (int64_t d : axes) reduced *= in[d];
  if (reduced == 1) return s.refuse("a reduction over size-1 dims only (a copy; oneDNN's reduction fails to run it)");
  s.in(n->input(0)).attr(A::axes, axes).attr(A::keep_dims, *keepdim);
  return true;
}

// F.interpolate's upsample_*.vec(input, output_size, [align_corners,] scale_factors). Linear modes:
// PyTorch's source coordinate is oneDNN's (half_pixel, clamped at the border) where its scale is
// in / out: given by output_size, or by whole scale factors. Nearest: PyTorch reads
// floor(dst * in / out), oneDNN round((dst + 0.5) * in / out - 0.5): the same where out is a whole
// multiple of in.
template <size_t Dims>
bool interpolate(const Node* n, OpSpec& s) {
  static const char* const linear_modes[] = {"", "linear", "bilinear", "trilinear"};
  bool nearest = n->inputs().size() == 3;
  if (rank(n->input(0)) != static_cast<int64_t>(Dims) + 2) return false;
  Ints in = sizes(n->input(0)), out = sizes(n->output());
  if (in.size() != Dims + 2 || out.size() != Dims + 2) return false;  // not profiled
  Ints in_sp(in.begin() + 2, in.end()), out_sp(out.begin() + 2, out.end());
  std::optional<bool> align_corners = nearest ? std::optional<bool>(false) : bool_arg(n, 2);
  Value* scales_arg = n->input(nearest ? 2 : 3);
  if (!align_corners) return false;
  if (*align_corners) return s.refuse("align_corners=True: oneDNN's CPU resampling has half_pixel only");
  for (size_t i = 0; i < Dims; ++i)
    if (nearest && out_sp[i] % in_sp[i] != 0)
      return s.refuse("nearest resampling by other than whole upsampling factors: PyTorch picks other pixels");
  std::vector<double> factors;
  if (auto sf = toIValue(scales_arg); sf && sf->isDoubleList()) factors = sf->toDoubleVector();
  bool whole = factors.size() == Dims &&
               std::all_of(factors.begin(), factors.end(), [](double f) { return f >= 1 && f == std::floor(f); });
  for (size_t i = 0; i < Dims && factors.size() == Dims && !whole; ++i)  // PyTorch samples by 1 / factor
    if (static_cast<double>(in_sp[i]) * factors[i] != static_cast<double>(out_sp[i]))
      return s.refuse("a scale factor that is not out / in: PyTorch samples by 1 / factor, oneDNN by in / out");
  s.in(n->input(0)).attr(A::mode, std::string(nearest ? "nearest" : linear_modes[Dims]))
      .attr(A::coordinate_transformation_mode, std::string("half_pixel"))
      .attr(A::data_format, std::string("NCX"));
  if (whole) return s.attr(A::scales, std::vector<float>(factors.begin(), factors.end())), true;  // for every input size
  s.shape_specific = s.spatial_only = true;  // the profiled output size
  return s.attr(A::sizes, out_sp), true;
}

// prelu(x, weight): one slope, or one per channel (dim 1).
bool prelu(const Node* n, OpSpec& s) {
  int64_t r = rank(n->input(0));
  if (r < 2 || rank(n->input(1)) != 1) return false;
  Ints w = sizes(n->input(1));
  if (w.empty() || (w[0] != 1 && w[0] != sizes(n->input(0))[1])) return false;
  s.in(n->input(0)).in(n->input(1)).attr(A::data_format, std::string("NCX")).attr(A::per_channel_broadcast, w[0] != 1);
  return true;
}

// softplus(x, beta, threshold): PyTorch returns x where x * beta > threshold, oneDNN always
// log(1 + exp(beta * x)) / beta; they differ by at most log1p(exp(-threshold)) / beta.
bool softplus(const Node* n, OpSpec& s) {
  auto beta = scalar_arg(n, 1), threshold = scalar_arg(n, 2);
  if (!beta || !threshold || *beta <= 0) return false;
  if (std::log1p(std::exp(-*threshold)) / *beta > 1e-7) return s.refuse("a softplus threshold oneDNN's formula (no linear branch) misses by over 1e-7");
  s.in(n->input(0)).attr(A::beta, static_cast<float>(*beta));
  return true;
}

bool cat(const Node* n, OpSpec& s) {
  Node* list = n->input(0)->node();
  auto dim = int_arg(n, 1);
  if (list->kind() != c10::prim::ListConstruct || list->inputs().size() < 2 || !dim) return false;
  int64_t r = rank(list->input(0));
  for (Value* v : list->inputs()) {
    if (rank(v) != r) return false;
    s.in(v);
  }
  s.attr(A::axis, wrap_dim(*dim, r));
  return true;
}

bool permute(const Node* n, OpSpec& s) {
  auto dims = ints_arg(n, 1);
  int64_t r = rank(n->input(0));
  if (!dims || static_cast<int64_t>(dims->size()) != r) return false;
  for (auto& d : *dims) d = wrap_dim(d, r);
  s.in(n->input(0)).attr(A::order, *dims);
  return true;
}

bool transpose(const Node* n, OpSpec& s) {
  auto d0 = int_arg(n, 1), d1 = int_arg(n, 2);
  int64_t r = rank(n->input(0));
  if (!d0 || !d1 || r < 1) return false;
  Ints order(r);
  for (int64_t i = 0; i < r; ++i) order[i] = i;
  std::swap(order[wrap_dim(*d0, r)], order[wrap_dim(*d1, r)]);
  s.in(n->input(0)).attr(A::order, order);
  return true;
}

bool reshape(const Node* n, OpSpec& s) {  // view/reshape/flatten: the profiled output sizes are static
  Ints out = sizes(n->output());
  if (out.empty()) return false;
  s.in(n->input(0)).attr(A::shape, out).attr(A::special_zero, false);
  s.shape_specific = true;
  return true;
}

bool contiguous(const Node* n, OpSpec& s) {
  auto fmt = int_arg(n, 1);
  return fmt && *fmt == static_cast<int64_t>(c10::MemoryFormat::Contiguous) && unary(n, s);
}

bool to_dtype(const Node* n, OpSpec& s) {
  if (!is_none(n, 4)) return false;  // memory_format
  auto in = n->input(0)->type()->expect<TensorType>()->scalarType();
  auto out = n->output()->type()->expect<TensorType>()->scalarType();
  return in && out && *in != *out && unary(n, s);
}

// ---- int8: Quantize/Dequantize (u8/s8 tensors appear nowhere else in the table) ------------

bool has_dtype(const Value* v, c10::ScalarType want) {
  auto t = v->type()->cast<TensorType>();
  return t && t->scalarType() == want;
}

bool per_tensor(OpSpec& s, double scale, int64_t zero_point) {
  s.attr(A::qtype, std::string("per_tensor")).attr(A::axis, int64_t{0})
      .attr(A::scales, std::vector<float>{static_cast<float>(scale)}).attr(A::zps, Ints{zero_point});
  return true;
}

bool quantize(const Node* n, OpSpec& s) {
  auto q = quantize_params(n);
  auto out = n->output()->type()->expect<TensorType>()->scalarType();
  if (!q || !has_dtype(n->input(0), c10::kFloat) || (out != c10::kQUInt8 && out != c10::kQInt8)) return false;
  if (quirks::layer_norm_quantized_output(n))
    return s.refuse("a quantize of a layer norm's output: oneDNN runs that layer norm in its reference kernel (quirk layer_norm_quantized_output)");
  s.in(n->input(0));
  return per_tensor(s, q->scale, q->zero_point);
}

// A frozen quantized weight: its int data goes to oneDNN as a constant s8 tensor and its quantization
// parameters become the Dequantize's attributes. oneDNN's int8 kernels take symmetric s8 weights only.
bool dequantize_weight(const at::Tensor& w, OpSpec& s, bool int8_kernels) {
  if (w.scalar_type() != c10::kQInt8 || !int8_kernels) return false;
  if (w.qscheme() == c10::kPerTensorAffine) return w.q_zero_point() == 0 && per_tensor(s, w.q_scale(), 0);
  // Per channel along dim 0 only: the output channels of conv (OIX) and linear ([out, in]) weights,
  // the one per-channel form oneDNN's int8 kernels take.
  if (w.qscheme() != c10::kPerChannelAffine || w.q_per_channel_axis() != 0) return false;
  auto zps = w.q_per_channel_zero_points().contiguous();
  auto scales = w.q_per_channel_scales().to(c10::kFloat).contiguous();
  const int64_t* zp = zps.data_ptr<int64_t>();
  if (std::any_of(zp, zp + zps.numel(), [](int64_t z) { return z != 0; })) return false;
  const float* sc = scales.data_ptr<float>();
  s.attr(A::qtype, std::string("per_channel")).attr(A::axis, int64_t{0})
      .attr(A::scales, std::vector<float>(sc, sc + scales.numel())).attr(A::zps, Ints(static_cast<size_t>(scales.numel()), 0));
  return true;
}

// Can oneDNN's int8 kernels take the weights dequantized by n? Without VNNI (quirk
// int8_without_vnni) only where every op reading them takes its src as u8 codes below 128
// (recorded by PrepareQuantization: PT2E's reduce_range): vpmaddubsw's pair sums then fit in 16
// bits (2 * 127 * 128 <= 32767).
bool int8_weights_exact(const Node* n) {
  if (!quirks::int8_without_vnni()) return true;
  const auto& uses = n->output()->uses();
  return !uses.empty() && std::all_of(uses.begin(), uses.end(), [](const torch::jit::Use& use) {
    if (use.offset != 1 || !in_family(use.user, kContraction)) return false;
    const Node* src = use.user->input(0)->node();
    return onednn_kind(src) == K::Dequantize && has_dtype(src->input(0), c10::kQUInt8) &&
           src->hasAttribute(kQuantMaxCode) && src->i(kQuantMaxCode) <= 127;
  });
}

// A conv reading `v` as its src whose weights are no dequantize (fp32: quirk dequantized_src_of_fp32_conv).
bool src_of_fp32_conv(const Value* v) {
  for (const auto& use : v->uses()) {
    const Node* conv = use.user;
    if (use.offset == 0 && onednn_kind(conv) == K::Convolution && conv->inputs().size() > 1 &&
        onednn_kind(conv->input(1)->node()) != K::Dequantize)
      return true;
  }
  return false;
}

bool dequantize(const Node* n, OpSpec& s) {
  if (!has_dtype(n->output(), c10::kFloat)) return false;
  if (!has_dtype(n->input(0), c10::kQUInt8) && !has_dtype(n->input(0), c10::kQInt8)) return false;
  s.in(n->input(0));
  if (n->hasAttribute(kQuantScale) && n->hasAttribute(kQuantZeroPoint)) {  // recorded by PrepareQuantization
    if (quirks::dequantized_src_of_fp32_conv() && src_of_fp32_conv(n->output()))
      return s.refuse("the input of a conv with fp32 weights: crashes oneDNN's partitioning (quirk dequantized_src_of_fp32_conv)");
    return per_tensor(s, n->f(kQuantScale), n->i(kQuantZeroPoint));
  }
  auto c = toIValue(n->input(0));
  return c && c->isTensor() && dequantize_weight(c->toTensor(), s, int8_weights_exact(n));
}

}  // namespace

std::optional<QuantParams> quantize_params(const Node* n) {
  if (n->kind() != c10::aten::quantize_per_tensor || n->inputs().size() != 4) return std::nullopt;
  auto scale = toIValue(n->input(1)), zp = toIValue(n->input(2));
  if (!scale || !zp) return std::nullopt;
  // quantize_per_tensor takes them as numbers or (the overload FX's reference models trace to) as
  // one-element tensors.
  std::optional<QuantParams> q;
  if (scale->isTensor() && zp->isTensor()) {
    const at::Tensor &s = scale->toTensor(), &z = zp->toTensor();
    if (s.numel() == 1 && z.numel() == 1 && s.is_floating_point() && !z.is_floating_point() && !z.is_quantized())
      q = QuantParams{s.item<double>(), z.item<int64_t>()};
  } else if (scale->isDouble() && zp->isInt()) {
    q = QuantParams{scale->toDouble(), zp->toInt()};
  }
  if (q && !(std::isfinite(static_cast<float>(q->scale)) && q->scale > 0)) return std::nullopt;
  return q;
}

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = {
      // convolution, normalization, matmul: compute-bound, worth a group alone
      {"aten::_convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, bool benchmark, bool deterministic, bool cudnn_enabled, bool allow_tf32) -> Tensor",
       K::Convolution, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return convolution(n, s, true); }},
      {"aten::_convolution.deprecated(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, int[] output_padding, SymInt groups, bool benchmark, bool deterministic, bool cudnn_enabled) -> Tensor",
       K::Convolution, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return convolution(n, s, true); }},
      {"aten::conv1d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=[1], SymInt[1] padding=[0], SymInt[1] dilation=[1], SymInt groups=1) -> Tensor",
       K::Convolution, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return convolution(n, s, false); }},
      {"aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], SymInt[2] padding=[0, 0], SymInt[2] dilation=[1, 1], SymInt groups=1) -> Tensor",
       K::Convolution, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return convolution(n, s, false); }},
      {"aten::conv3d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[3] stride=[1, 1, 1], SymInt[3] padding=[0, 0, 0], SymInt[3] dilation=[1, 1, 1], SymInt groups=1) -> Tensor",
       K::Convolution, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return convolution(n, s, false); }},
      {"aten::conv_transpose1d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=[1], SymInt[1] padding=[0], SymInt[1] output_padding=[0], SymInt groups=1, SymInt[1] dilation=[1]) -> Tensor",
       K::ConvTranspose, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return conv_transpose(n, s, {3, 4, 5, 6, 7}); }},
      {"aten::conv_transpose2d.input(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], SymInt[2] padding=[0, 0], SymInt[2] output_padding=[0, 0], SymInt groups=1, SymInt[2] dilation=[1, 1]) -> Tensor",
       K::ConvTranspose, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return conv_transpose(n, s, {3, 4, 5, 6, 7}); }},
      {"aten::conv_transpose3d.input(Tensor input, Tensor weight, Tensor? bias=None, SymInt[3] stride=[1, 1, 1], SymInt[3] padding=[0, 0, 0], SymInt[3] output_padding=[0, 0, 0], SymInt groups=1, SymInt[3] dilation=[1, 1, 1]) -> Tensor",
       K::ConvTranspose, kWorthAlone | kKeepsNaN | kContraction, [](const Node* n, OpSpec& s) { return conv_transpose(n, s, {3, 4, 5, 6, 7}); }},
      {"aten::batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor",
       K::BatchNormInference, kWorthAlone | kShapePreserving | kKeepsNaN | kFloatParams, batch_norm},
      {"aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1.0000000000000001e-05, bool cudnn_enable=True) -> Tensor",
       K::LayerNorm, kWorthAlone | kShapePreserving | kFloatParams, layer_norm},
      {"aten::group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1.0000000000000001e-05, bool cudnn_enabled=True) -> Tensor",
       K::GroupNorm, kWorthAlone | kShapePreserving | kFloatParams, group_norm},
      {"aten::rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
       K::RMSNorm, kWorthAlone | kShapePreserving | kFloatParams, rms_norm},
      {"aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", K::MatMul, kWorthAlone | kKeepsNaN | kContraction, linear, PlanStep::kLinear},
      {"aten::matmul(Tensor self, Tensor other) -> Tensor", K::MatMul, kWorthAlone | kKeepsNaN | kContraction, matmul, PlanStep::kMatmul},
      {"aten::mm(Tensor self, Tensor mat2) -> Tensor", K::MatMul, kWorthAlone | kKeepsNaN | kContraction | kMatrixProduct2d, matmul, PlanStep::kMatmul},
      {"aten::bmm(Tensor self, Tensor mat2) -> Tensor", K::MatMul, kWorthAlone | kKeepsNaN | kContraction, matmul, PlanStep::kMatmul},
      {"aten::softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", K::SoftMax, kWorthAlone | kShapePreserving, softmax},
      {"aten::log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", K::LogSoftmax, kWorthAlone | kShapePreserving, softmax},
      {"llga::softmax_inf_as_zero(Tensor self, int dim) -> Tensor", K::SoftMax, kWorthAlone | kShapePreserving, softmax_inf_as_zero},
      {"aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor",
       K::MaxPool, kWorthAlone | kPooling, max_pool<2>},
      {"aten::max_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False) -> Tensor",
       K::MaxPool, kWorthAlone | kPooling, max_pool<3>},
      {"aten::max_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], int[1] dilation=[1], bool ceil_mode=False) -> Tensor",
       K::MaxPool, kWorthAlone | kPooling, max_pool<1>},
      {"aten::avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], bool ceil_mode=False, bool count_include_pad=True) -> Tensor",
       K::AvgPool, kWorthAlone | kPooling, avg_pool<1>},
      {"aten::avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
       K::AvgPool, kWorthAlone | kPooling, avg_pool<2>},
      {"aten::avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
       K::AvgPool, kWorthAlone | kPooling, avg_pool<3>},
      {"aten::adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor", K::AvgPool, kWorthAlone | kPooling, adaptive_avg_pool},
      // reductions and resampling (linear modes: at a whole source coordinate oneDNN reads one pixel,
      // PyTorch two, the other weighted 0: NaN there is eager's, a number fused; no kKeepsNaN)
      {"aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", K::ReduceMean, kKeepsNaN | kReduction, reduce},
      {"aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", K::ReduceSum, kKeepsNaN | kReduction, reduce},
      {"aten::amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", K::ReduceMax, kNone | kReduction, reduce},
      {"aten::amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", K::ReduceMin, kNone | kReduction, reduce},
      {"aten::upsample_nearest1d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor", K::Interpolate, kWorthAlone | kKeepsNaN, interpolate<1>},
      {"aten::upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor", K::Interpolate, kWorthAlone | kKeepsNaN, interpolate<2>},
      {"aten::upsample_nearest3d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor", K::Interpolate, kWorthAlone | kKeepsNaN, interpolate<3>},
      {"aten::upsample_linear1d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor", K::Interpolate, kWorthAlone, interpolate<1>},
      {"aten::upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor", K::Interpolate, kWorthAlone, interpolate<2>},
      {"aten::upsample_trilinear3d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor", K::Interpolate, kWorthAlone, interpolate<3>},
      // binary (scalar operands become tensors in prepare_binary)
      {"aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", K::Add, kKeepsNaN | kBinary | kAdditive | kStrideAgnostic, binary_alpha, PlanStep::kAdd},
      {"aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", K::Subtract, kKeepsNaN | kBinary | kAdditive | kStrideAgnostic, binary_alpha, PlanStep::kSub},
      {"aten::mul.Tensor(Tensor self, Tensor other) -> Tensor", K::Multiply, kKeepsNaN | kBinary | kMultiplicative | kStrideAgnostic, elementwise_binary, PlanStep::kMul},
      {"aten::div.Tensor(Tensor self, Tensor other) -> Tensor", K::Divide, kKeepsNaN | kBinary | kMultiplicative | kStrideAgnostic, elementwise_binary, PlanStep::kDiv},
      {"aten::maximum(Tensor self, Tensor other) -> Tensor", K::Maximum, kBinary | kStrideAgnostic, elementwise_binary, PlanStep::kMaximum},
      {"aten::minimum(Tensor self, Tensor other) -> Tensor", K::Minimum, kBinary | kStrideAgnostic, elementwise_binary, PlanStep::kMinimum},
      {"aten::prelu(Tensor self, Tensor weight) -> Tensor", K::PReLU, kShapePreserving, prelu},
      // where(condition, self, other): the boolean mask of attention (decompose_ops' SDPA)
      {"aten::where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", K::Select, kKeepsNaN | kBinary | kStrideAgnostic,
       [](const Node* n, OpSpec& s) {
         if (quirks::matmul_broadcast_select(n)) return false;
         s.in(n->input(0)).in(n->input(1)).in(n->input(2));
         return true;
       }},
      // unary elementwise
      {"aten::relu(Tensor self) -> Tensor", K::ReLU, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kRelu},
      {"aten::gelu(Tensor self, *, str approximate=\"none\") -> Tensor", K::GELU, kShapePreserving | kEltwise | kStrideAgnostic, gelu, PlanStep::kGelu},
      {"aten::sigmoid(Tensor self) -> Tensor", K::Sigmoid, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kSigmoid},
      {"aten::tanh(Tensor self) -> Tensor", K::Tanh, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kTanh},
      {"aten::elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor", K::Elu, kShapePreserving | kEltwise | kStrideAgnostic, elu, PlanStep::kElu},
      {"aten::leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor", K::LeakyReLU, kShapePreserving | kEltwise | kStrideAgnostic, leaky_relu, PlanStep::kLeakyRelu},
      {"aten::hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor", K::Clamp, kShapePreserving | kEltwise | kStrideAgnostic, hardtanh, PlanStep::kClamp},
      {"aten::relu6(Tensor self) -> Tensor", K::Clamp, kShapePreserving | kEltwise | kStrideAgnostic,
       [](const Node* n, OpSpec& s) { return clamp_to(s, n->input(0), 0.0, 6.0); }, PlanStep::kRelu6},
      {"aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor", K::Clamp, kShapePreserving | kEltwise | kStrideAgnostic, clamp, PlanStep::kClamp},
      {"aten::hardswish(Tensor self) -> Tensor", K::HardSwish, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kHardSwish},
      {"aten::hardsigmoid(Tensor self) -> Tensor", K::HardSigmoid, kShapePreserving | kEltwise | kStrideAgnostic,  // clamp(x / 6 + 1/2, 0, 1)
       [](const Node* n, OpSpec& s) { s.in(n->input(0)).attr(A::alpha, 1.0f / 6.0f).attr(A::beta, 0.5f); return true; }, PlanStep::kHardSigmoid},
      {"aten::exp(Tensor self) -> Tensor", K::Exp, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kExp},
      {"aten::log(Tensor self) -> Tensor", K::Log, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kLog},
      {"aten::sqrt(Tensor self) -> Tensor", K::Sqrt, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kSqrt},
      {"aten::abs(Tensor self) -> Tensor", K::Abs, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kAbs},
      {"aten::square(Tensor self) -> Tensor", K::Square, kShapePreserving | kEltwise | kStrideAgnostic, unary, PlanStep::kSquare},
      {"aten::round(Tensor self) -> Tensor", K::Round, kShapePreserving | kEltwise | kStrideAgnostic, round},
      {"aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor", K::Pow, kShapePreserving | kEltwise | kStrideAgnostic, pow_scalar},
      {"aten::mish(Tensor self) -> Tensor", K::Mish, kShapePreserving | kEltwise | kStrideAgnostic, unary},
      {"aten::softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor", K::SoftPlus, kShapePreserving | kEltwise | kStrideAgnostic, softplus},
      {"aten::reciprocal(Tensor self) -> Tensor", K::Reciprocal, kShapePreserving | kStrideAgnostic | kKeepsNaN, unary},  // no post-op: x * (1 / y) only
      // data movement
      {"aten::cat(Tensor[] tensors, int dim=0) -> Tensor", K::Concat, kKeepsNaN, cat, PlanStep::kCat},
      {"aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)", K::StaticTranspose, kKeepsNaN | kView, permute, PlanStep::kPermute},
      {"aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", K::StaticTranspose, kKeepsNaN | kView, transpose, PlanStep::kTranspose},
      {"aten::reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)", K::StaticReshape, kKeepsNaN | kView, reshape, PlanStep::kReshape},
      {"aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)", K::StaticReshape, kKeepsNaN | kView, reshape, PlanStep::kReshape},
      {"aten::flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)", K::StaticReshape, kKeepsNaN | kView, reshape, PlanStep::kReshape},
      {"aten::contiguous(Tensor(a) self, *, MemoryFormat memory_format=0) -> Tensor(a)", K::Reorder, kShapePreserving | kKeepsNaN | kView, contiguous, PlanStep::kContiguous},
      // int8: FX's reference quantized models (quantize -> dequantize around fp32 ops); oneDNN
      // fuses dequantize -> conv/matmul/pool -> post-ops -> quantize into int8 kernels.
      {"aten::quantize_per_tensor(Tensor self, float scale, int zero_point, ScalarType dtype) -> Tensor",
       K::Quantize, kShapePreserving | kCastsDtype, quantize},
      {"aten::quantize_per_tensor.tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, ScalarType dtype) -> Tensor",
       K::Quantize, kShapePreserving | kCastsDtype, quantize},
      // (A dequantize reads codes, which hold no NaN/Inf: nothing to keep from it, nothing to scan.)
      {"aten::dequantize.self(Tensor self) -> Tensor", K::Dequantize, kShapePreserving | kCastsDtype | kKeepsNaN, dequantize},
      {"aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)",
       K::TypeCast, kShapePreserving | kCastsDtype | kKeepsNaN, to_dtype},
      // No oneDNN mapping: the other facts of ops the passes and the small-graph plan handle.
      {"aten::add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor", K::Wildcard, kAdditive | kStrideAgnostic, nullptr, PlanStep::kAdd},
      {"aten::sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor", K::Wildcard, kAdditive | kStrideAgnostic, nullptr, PlanStep::kSub},
      {"aten::mul.Scalar(Tensor self, Scalar other) -> Tensor", K::Wildcard, kMultiplicative | kStrideAgnostic, nullptr, PlanStep::kMul},
      {"aten::div.Scalar(Tensor self, Scalar other) -> Tensor", K::Wildcard, kMultiplicative | kStrideAgnostic, nullptr, PlanStep::kDiv},
      {"aten::silu(Tensor self) -> Tensor", K::Wildcard, kStrideAgnostic | kFunctionalForm, nullptr, PlanStep::kSilu},
      {"aten::neg(Tensor self) -> Tensor", K::Wildcard, kStrideAgnostic, nullptr, PlanStep::kNeg},
      {"aten::t(Tensor(a) self) -> Tensor(a)", K::Wildcard, kView, nullptr, PlanStep::kT},
      {"aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)", K::Wildcard, kView, nullptr, PlanStep::kUnsqueeze},
      {"aten::squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)", K::Wildcard, kView, nullptr, PlanStep::kSqueeze},
      {"aten::slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)", K::Wildcard, kView, nullptr},
      {"aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)", K::Wildcard, kView, nullptr},
      {"aten::expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)", K::Wildcard, kView, nullptr},
      {"aten::dropout(Tensor input, float p, bool train) -> Tensor", K::Wildcard, kNone, nullptr, PlanStep::kDropout},
      {"aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor", K::Wildcard, kFunctionalForm, nullptr, PlanStep::kAddmm},
  };
  return table;
}

const char* kind_name(op::kind kind) {
  switch (kind) {
    case K::Abs: return "Abs";
    case K::Add: return "Add";
    case K::AvgPool: return "AvgPool";
    case K::BatchNormInference: return "BatchNormInference";
    case K::Clamp: return "Clamp";
    case K::Concat: return "Concat";
    case K::ConvTranspose: return "ConvTranspose";
    case K::Convolution: return "Convolution";
    case K::Dequantize: return "Dequantize";
    case K::Divide: return "Divide";
    case K::Elu: return "Elu";
    case K::Exp: return "Exp";
    case K::GELU: return "GELU";
    case K::GroupNorm: return "GroupNorm";
    case K::HardSigmoid: return "HardSigmoid";
    case K::HardSwish: return "HardSwish";
    case K::Interpolate: return "Interpolate";
    case K::LayerNorm: return "LayerNorm";
    case K::LeakyReLU: return "LeakyReLU";
    case K::Log: return "Log";
    case K::LogSoftmax: return "LogSoftmax";
    case K::MatMul: return "MatMul";
    case K::MaxPool: return "MaxPool";
    case K::Maximum: return "Maximum";
    case K::Minimum: return "Minimum";
    case K::Mish: return "Mish";
    case K::Multiply: return "Multiply";
    case K::PReLU: return "PReLU";
    case K::Pow: return "Pow";
    case K::Quantize: return "Quantize";
    case K::RMSNorm: return "RMSNorm";
    case K::ReLU: return "ReLU";
    case K::Reciprocal: return "Reciprocal";
    case K::ReduceMax: return "ReduceMax";
    case K::ReduceMean: return "ReduceMean";
    case K::ReduceMin: return "ReduceMin";
    case K::ReduceSum: return "ReduceSum";
    case K::Reorder: return "Reorder";
    case K::Round: return "Round";
    case K::Select: return "Select";
    case K::Sigmoid: return "Sigmoid";
    case K::SoftMax: return "SoftMax";
    case K::SoftPlus: return "SoftPlus";
    case K::Sqrt: return "Sqrt";
    case K::Square: return "Square";
    case K::StaticReshape: return "StaticReshape";
    case K::StaticTranspose: return "StaticTranspose";
    case K::Subtract: return "Subtract";
    case K::Tanh: return "Tanh";
    case K::TypeCast: return "TypeCast";
    case K::Wildcard: return "Wildcard";
    default: return "?";
  }
}

const char* flag_name(unsigned bit) {
  switch (bit) {
    case kWorthAlone: return "kWorthAlone";
    case kShapePreserving: return "kShapePreserving";
    case kCastsDtype: return "kCastsDtype";
    case kKeepsNaN: return "kKeepsNaN";
    case kFloatParams: return "kFloatParams";
    case kContraction: return "kContraction";
    case kPooling: return "kPooling";
    case kEltwise: return "kEltwise";
    case kBinary: return "kBinary";
    case kAdditive: return "kAdditive";
    case kMultiplicative: return "kMultiplicative";
    case kStrideAgnostic: return "kStrideAgnostic";
    case kView: return "kView";
    case kMatrixProduct2d: return "kMatrixProduct2d";
    case kFunctionalForm: return "kFunctionalForm";
    case kReduction: return "kReduction";
    default: return nullptr;
  }
}

namespace {
// Entries grouped by node kind, each with its resolved operator, so a lookup is a hash and a pointer compare.
struct Index {
  std::unordered_map<c10::Symbol, std::vector<std::pair<const torch::jit::Operator*, const OpEntry*>>> by_kind;
  Index() {
    for (const auto& e : op_table()) {
      auto op = torch::jit::getOperatorForLiteral(e.schema);
      TORCH_CHECK(op, "torch_llga: op table schema not registered: ", e.schema);
      by_kind[c10::Symbol::fromQualString(op->schema().name())].emplace_back(op.get(), &e);
    }
  }
};
const Index& index() {
  static const Index idx;
  return idx;
}

// Why oneDNN may not take this tensor, or "" if it may: CPU, profiled, not empty, of a dtype the
// table maps (`condition`: a Select's boolean mask instead). unmapped_reason says the same words.
std::string tensor_problem(const Value* v, bool condition = false) {
  auto t = v->type()->cast<TensorType>();
  if (!t) return "not a tensor";
  auto s = t->sizes().concrete_sizes();
  if (!t->device() || !t->scalarType() || !s || !t->strides().concrete_sizes()) return "sizes or dtype not profiled";
  if (!t->device()->is_cpu()) return "not on CPU";
  if (condition ? *t->scalarType() != c10::ScalarType::Bool : !to_dnnl_dtype(*t->scalarType()))
    return std::string("dtype ") + c10::toString(*t->scalarType()) + " not supported (" + computed_dtype_names() + " are)";
  if (t->numel() == 0) return "empty tensor";
  if (s->empty() && v->node()->kind() != c10::prim::Constant) return "0-dim tensor";  // a 0-dim constant is a [1]
  return "";
}

bool supported_tensor(const Value* v, bool condition = false) { return tensor_problem(v, condition).empty(); }
}  // namespace

const OpEntry* find_entry(const Node* n) {
  const auto& idx = index().by_kind;
  auto it = idx.find(n->kind());
  if (it == idx.end()) return nullptr;
  const torch::jit::Operator* op = n->maybeOperator() ? &n->getOperator() : nullptr;
  for (const auto& [entry_op, entry] : it->second)
    if (entry_op == op || (op && entry_op->schema() == op->schema())) return entry;
  return nullptr;
}

// Guards check tensors only: any other input must be a constant the mapping baked in (a shape
// computed at run time from aten::size, say, could change while the tensors' sizes do not).
bool non_tensor_inputs_constant(const Node* n) {
  for (const Value* v : n->inputs()) {
    if (is_tensor(v) || v->node()->kind() == c10::prim::Constant) continue;
    bool tensor_list = v->node()->kind() == c10::prim::ListConstruct;
    for (const Value* e : v->node()->inputs()) tensor_list = tensor_list && is_tensor(e);
    if (!tensor_list) return false;
  }
  return true;
}

namespace {
std::optional<OpSpec> try_map(const Node* n) {
  const OpEntry* e = find_entry(n);
  if (!e || !e->maps_to_onednn() || n->outputs().size() != 1 || !supported_tensor(n->output()) ||
      !non_tensor_inputs_constant(n))
    return std::nullopt;
  OpSpec spec;
  spec.kind = e->kind;
  if (!e->build(n, spec)) return std::nullopt;
  if (quirks::above_five_dims(n, spec.inputs)) return std::nullopt;
  const DtypeTraits* out = dtype_traits(*n->output()->type()->expect<TensorType>()->scalarType());
  // Only Quantize and Dequantize know a quantized tensor's scale and zero point: any other op would
  // read its int data as if it were the values.
  bool quant_op = e->kind == K::Quantize || e->kind == K::Dequantize;
  if (!quant_op && out->quantized) return std::nullopt;
  for (const Value* v : spec.inputs) {
    if (e->kind == K::Select && v == spec.inputs[0]) {  // where(condition, self, other)
      if (!supported_tensor(v, /*condition=*/true)) return std::nullopt;
      continue;
    }
    if (!supported_tensor(v)) return std::nullopt;
    const DtypeTraits* in = dtype_traits(*v->type()->expect<TensorType>()->scalarType());
    if (!quant_op && in->quantized) return std::nullopt;
    bool float_param = (e->flags & kFloatParams) && v != spec.inputs[0] && out->rounds_from_fp32 &&
                       in->scalar == c10::ScalarType::Float;
    if (!(e->flags & kCastsDtype) && in != out && !float_param) return std::nullopt;
  }
  return spec;
}
}  // namespace

namespace {
// Why n does not map; `mapped`: whether try_map(n) gives a spec, if the caller knows.
std::string explain_unmapped(const Node* n, std::optional<bool> mapped) {
  const OpEntry* e = find_entry(n);
  if (!e || !e->maps_to_onednn()) {
    return kind_maps_to_onednn(n->kind()) ? "no oneDNN mapping for this overload" : "no oneDNN mapping";
  }
  if (n->outputs().size() != 1) return "more than one output";
  std::vector<const Value*> tensors{n->output()};
  for (const Value* v : n->inputs())
    if (is_tensor(v)) tensors.push_back(v);
  for (const Value* v : tensors) {
    // where(condition, self, other) reads a boolean mask
    bool condition = e->kind == op::kind::Select && v == n->input(0);
    if (auto problem = tensor_problem(v, condition); !problem.empty()) return problem;
  }
  if (!non_tensor_inputs_constant(n)) return "an argument computed at run time (guards check tensors only)";
  if (!(mapped ? *mapped : try_map(n).has_value())) {
    OpSpec spec;
    if (!e->build(n, spec) && spec.refused) return spec.refused;
    return "arguments outside the mapping's conditions (op_table.cpp)";
  }
  return "";
}
}  // namespace

std::optional<OpSpec> map_node(const Node* n, std::string* why) {
  auto spec = try_map(n);
  if (!spec && why) *why = explain_unmapped(n, false);  // try_map ran once, here
  return spec;
}

std::string unmapped_reason(const Node* n) { return explain_unmapped(n, std::nullopt); }

const BlockMappings::Mapping& BlockMappings::get(const Node* n) {
  auto it = by_node_.find(n);
  if (it != by_node_.end()) return it->second;
  Mapping m;
  m.spec = map_node(n, &m.why);
  return by_node_.emplace(n, std::move(m)).first->second;
}

bool is_tensor(const Value* v) { return v->type()->kind() == c10::TypeKind::TensorType; }

bool kind_maps_to_onednn(c10::Symbol kind) {
  auto it = index().by_kind.find(kind);
  if (it == index().by_kind.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [](const auto& e) { return e.second->maps_to_onednn(); });
}

bool functional_form_fuses(c10::Symbol kind) {
  auto it = index().by_kind.find(kind);
  if (it == index().by_kind.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [](const auto& e) { return e.second->maps_to_onednn() || (e.second->flags & kFunctionalForm); });
}

unsigned kind_flags(c10::Symbol kind) {
  auto it = index().by_kind.find(kind);
  if (it == index().by_kind.end()) return kNone;
  unsigned flags = ~0u;
  for (const auto& [op, entry] : it->second) flags &= entry->flags;
  return flags;
}

op::kind onednn_kind(const Node* n) {
  const OpEntry* e = find_entry(n);
  return e && e->maps_to_onednn() ? e->kind : op::kind::Wildcard;
}

bool in_family(const Node* n, unsigned families) {
  const OpEntry* e = find_entry(n);
  return e && (e->flags & families);
}

}  // namespace llga
