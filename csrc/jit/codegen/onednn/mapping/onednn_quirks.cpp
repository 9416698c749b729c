// The oneDNN faults torch_llga works around (see onednn_quirks.h): the registry, then each
// predicate with the details of its fault.
//
// Faults whose workaround is gone (re-tested with it off on 3.12.0; the test kept):
// - a binary post-op after softmax with a broadcast operand ([3,5,8] * [1,5,1]) computed garbage
//   and a lower-rank one did not compile (v3.2): every broadcast form now matches eager
//   (test_patterns.py::test_binary_post_ops_onednn_gets_wrong, softmax case);
// - a bf16 batch norm after a matmul read its bf16 statistics as f32 (v3.2): 3.12 forms no such
//   partition (test_patterns.py::test_bf16_batch_norm_only_after_conv);
// - no layer normalization primitive for 1-D data: v3.2 offered the partition and failed to
//   compile it; 3.12 offers none (test_ops.py::test_layer_norm_of_a_1d_input_stays_in_pytorch).
#include "jit/codegen/onednn/mapping/onednn_quirks.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/jit_log.h>

#include <algorithm>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "jit/codegen/onednn/mapping/op_table.h"
#include "onednn/torch_onednn.h"

namespace llga::quirks {

using torch::jit::TensorType;
using torch::jit::Value;
using K = dnnl::graph::op::kind;

namespace {

// The registry: one row a workaround. Versions are oneDNN's ("3.2" is PyPI's onednn 3.2, the others
// the oneDNN inside torch 2.12.1 (3.11.2), 2.14.1 (3.12.0) and 2.15.0 (3.13.3)); "seen on" counts
// a version where the fault itself showed (test/quirk_probes.py, fuzzing, sweeps), "fixed in" one
// where the same probe, CPU and kernel showed it gone. Each predicate's comment below keeps the
// details and measurements.
constexpr Quirk kQuirks[] = {
    // op_table.cpp: mappings refused
    {"linear_4d_broadcast_post_op",
     "A linear on a 4-D input whose binary post-op operand broadcasts along some but not all of the output's first three dims computes wrong values.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_4d_linear_post_op_broadcast",
     "linear_4d_broadcast_post_op (op_table.cpp)", ""},
    {"matmul_last_dim_broadcast_post_op",
     "A matmul's binary post-op broadcast along the last dim computes wrong values (batched) or runs a reference kernel (2-D).",
     "3.2 3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_batched_matmul_then_per_row_add",
     "matmul_last_dim_broadcast_post_op (op_table.cpp)", ""},
    {"one_row_matmul_sum_post_op",
     "An fp32 matmul of one row with a sum post-op (an add of the output's sizes) crashes in its brgemm kernel.",
     "3.11.2 3.12.0", "3.13.3", "test/test_patterns.py::test_one_row_matmul_then_full_size_add_stays_in_pytorch",
     "one_row_matmul_sum_post_op (op_table.cpp)", ""},
    {"conv_per_sample_post_op",
     "A convolution's binary post-op varying per sample only (per sample and channel after a grouped one) runs a reference kernel, 150-340x slower.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_per_sample_post_op_of_a_conv_stays_in_pytorch",
     "conv_per_sample_post_op (op_table.cpp)", ""},
    {"matmul_per_batch_column_post_op",
     "A batched matmul's binary post-op varying along an inner batch dim and N but broadcast along M runs a reference kernel, 2000x slower.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_per_head_bias_of_a_batched_matmul_stays_in_pytorch",
     "matmul_per_batch_column_post_op (op_table.cpp)", ""},
    {"conv_spatial_broadcast_post_op",
     "A binary op after a convolution whose operand varies spatially but broadcasts along another dim runs a reference kernel, 7x slower.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_spatially_broadcast_post_op_of_a_conv_stays_in_pytorch",
     "conv_spatial_broadcast_post_op (op_table.cpp)", ""},
    {"matmul_broadcast_select",
     "A where(mask, matmul, y) with a broadcast mask or y runs a reference kernel, 27x slower.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_broadcast_where_after_a_matmul_stays_in_pytorch",
     "matmul_broadcast_select (op_table.cpp)", ""},
    {"layer_norm_4d_last_dim_broadcast_post_op",
     "A 4-D layer norm's binary post-op broadcast along the last dim runs a reference kernel, 40x slower.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_per_row_post_op_of_a_4d_layer_norm_stays_in_pytorch",
     "layer_norm_4d_last_dim_broadcast_post_op (op_table.cpp)", ""},
    {"one_element_layer_norm_post_op",
     "A binary post-op of a layer norm over one element gives 0 or 1 instead of its value.",
     "3.11.2 3.12.0", "", "test/test_fallback.py::test_one_element_layer_norm_post_op_stays_in_pytorch",
     "one_element_layer_norm_post_op (op_table.cpp)", ""},
    {"matrix_vector_product",
     "A matmul with one output column runs 2-10x slower than PyTorch's.",
     "3.2 3.11.2 3.12.0 3.13.3", "", "test/test_ops.py::test_matrix_vector_products_stay_in_pytorch",
     "matrix_vector_product (op_table.cpp)", ""},
    {"bf16_round",
     "No bf16 Round kernel: round with a post-op forms a partition that fails to compile.",
     "3.2 3.12.0", "", "test/test_ops.py::test_bf16_round_stays_in_pytorch", "bf16_round (op_table.cpp)", "bf16"},
    {"above_five_dims",
     "Tensors of more than 5 dims reach a reference kernel that indexes 5: wrong values and writes past the output.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_fallback.py::test_six_dim_tensors_stay_in_pytorch",
     "above_five_dims (op_table.cpp)", ""},
    {"one_channel_unit_width_conv",
     "An fp32 conv2d of one input channel, output width 1 and a width stride above 1 leaves output elements unwritten.",
     "3.12.0", "", "test/test_patterns.py::test_one_channel_conv_of_unit_output_width",
     "one_channel_unit_width_conv (op_table.cpp)", "avx512"},
    {"int8_without_vnni",
     "Without VNNI, int8 matmuls add pairs of u8 x s8 products in saturating 16-bit integers: wrong values.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_int8.py::test_int8_weights_without_vnni_run_in_fp32",
     "int8_without_vnni (op_table.cpp)", ""},
    {"dequantized_src_of_fp32_conv",
     "A convolution whose src comes from a Dequantize and whose weights from no op crashes oneDNN's partitioning.",
     "3.12.0", "", "test/test_int8.py::test_dequantized_input_of_an_fp32_weight_conv",
     "dequantized_src_of_fp32_conv (op_table.cpp)", ""},
    {"dilated_unit_kernel",
     "A convolution with a size-1 kernel dim dilated (bf16; grouped fp32 on AVX2) segfaults in its brgemm kernel.",
     "3.11.2 3.12.0", "",
     "test/test_patterns.py::test_dilated_size_one_kernel_bf16 test/test_patterns.py::test_dilated_size_one_kernel_grouped_fp32",
     "dilated_unit_kernel (op_table.cpp)", ""},
    {"pow_as_square_sqrt",
     "A Pow op forms no fused partition: pow(x, 2) and pow(x, 0.5) are given as Square and Sqrt.",
     "3.2", "", "test/test_ops.py::test_unary[pow-0] test/test_ops.py::test_unary[pow-1]", "op_table.cpp, pow_scalar", ""},
    {"global_avg_pool_as_avg_pool",
     "ReduceMean of a channels-last or blocked input runs a reference kernel: adaptive_avg_pool2d to 1x1 is an AvgPool instead.",
     "3.2", "", "test/test_patterns.py::test_global_average_pool_of_a_conv_runs_no_reference_kernel",
     "op_table.cpp, global_avg_pool", ""},
    {"reduction_reads_plain",
     "A reduction (ReduceMean, ReduceSum, ReduceMax, ReduceMin) of a channels-last or blocked input, or over other than its innermost dims, runs a reference kernel.",
     "3.12.0", "", "test/test_patterns.py::test_reduction_of_a_conv_output_runs_no_reference_kernel test/test_ops.py::test_reduction_of_outer_dims_stays_in_pytorch",
     "reduction_reads_plain, reduction_of_outer_dims (op_table.cpp, passes/layout_propagation.cpp, runtime/bind.cpp)", ""},
    {"group_norm_slow_kernel",
     "Group norm runs a reference kernel on a plain input and jit_group on a channels-last one, both slower than PyTorch's (1x128x32x32, 32 groups: 1.4 and 0.2 ms against 0.07).",
     "3.12.0", "", "test/test_ops.py::test_group_norm_stays_in_pytorch",
     "group_norm_slow_kernel (op_table.cpp)", "", true},
    {"gelu_post_op_slow",
     "A GELU post-op of an fp32 matmul costs 2-3x PyTorch's GELU of the same output in AVX2 kernels (128x768 x 768x3072: +1.2 ms against 0.5).",
     "3.12.0", "", "test/test_ops.py::test_gelu_of_a_matmul_stays_in_pytorch_on_avx2",
     "gelu_post_op_slow (op_table.cpp)", "avx2", true},
    {"layer_norm_quantized_output",
     "A LayerNorm whose output a Quantize takes (u8 dst, the scale and zero point as post-ops) runs the reference kernel: [1, 197, 768] 6.8-18.5 ms against 0.06 for the LayerNorm alone.",
     "3.12.0", "", "test/test_int8.py::test_quantize_of_a_layer_norm_stays_apart",
     "layer_norm_quantized_output (op_table.cpp, passes/own_layer_norm.cpp)", ""},
    {"pooling_reads_channels_last",
     "A 1-D or 3-D pooling of a plain (ncw, ncdhw) input runs the simple_nchw kernel, over 20x slower than PyTorch's (channels-last: a fast one).",
     "3.12.0", "", "test/test_ops.py::test_pooling_1d_3d_of_a_plain_input_stays_in_pytorch",
     "pooling_of_a_plain_input (op_table.cpp), pooling_reads_channels_last (runtime/bind.cpp)", ""},
    // graph_fuser.cpp: partitions oneDNN formed
    {"pooling_binary_post_op",
     "Pooling with a binary post-op on its output (not a constant scalar) computes wrong values.",
     "3.2 3.12.0", "",
     "test/test_patterns.py::test_binary_post_ops_onednn_gets_wrong test/test_patterns.py::test_residual_add_of_a_pooling_output_is_a_conv_post_op",
     "pooling_binary_post_op (graph_fuser.cpp, runtime/new_sizes.cpp)", "avx512"},
    {"layer_norm_sum_post_op",
     "A layer norm with an add of a tensor of its output's sizes (a sum post-op) computes wrong values.",
     "3.11.2 3.12.0", "", "test/test_patterns.py::test_layer_norm_then_full_size_add",
     "layer_norm_sum_post_op (graph_fuser.cpp, runtime/new_sizes.cpp)", ""},
    {"per_channel_post_op_at_unit_spatial",
     "A binary op's per-channel post-op at [N > 1, C, 1, ..] applies one channel's value to all.",
     "3.11.2 3.12.0 3.13.3", "",
     "test/test_patterns.py::test_per_channel_post_op_of_a_binary_at_unit_spatial test/test_patterns.py::test_per_channel_post_op_at_unit_spatial_every_rank",
     "per_channel_post_op_at_unit_spatial (graph_fuser.cpp, runtime/new_sizes.cpp)", ""},
    {"broadcast_up_post_op",
     "A partition's [N, C, 1, 1] value broadcast up to an outside [N, C, H, W] runs as a binary primitive of its own, several times slower than PyTorch.",
     "3.12.0", "", "test/test_patterns.py::test_squeeze_excitation_scale_runs_in_pytorch_on_channels_last",
     "broadcast_up_post_op (graph_fuser.cpp)", "avx512"},
    // prepare_quantization.cpp
    {"int8_sum_of_own_input",
     "An int8 conv whose sum post-op reads the conv's own input does not compile.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_int8.py::test_small_cnn_int8_patterns",
     "int8_sum_of_own_input (prepare_quantization.cpp)", ""},
    // decompose_ops.cpp
    {"sdpa_scale_4d",
     "No SDPA partition compiles with a 1-D scale: the scale is a [1, 1, 1, 1] tensor.",
     "3.12.0", "", "test/test_patterns.py::test_scaled_dot_product_attention_is_one_partition",
     "decompose_ops.cpp, llga::sdpa_scale", ""},
    {"bf16_layer_norm_fp32_params",
     "No partition forms of a bf16 layer norm with bf16 weight and bias: they are given as fp32.",
     "3.12.0", "", "test/test_bf16.py::test_bf16_layer_norm_is_fused",
     "decompose_ops.cpp, widen_bf16_layer_norm_params", "bf16"},
    // graph_builder.cpp
    {"end_of_boolean_output",
     "The End op takes no boolean tensor: a graph returning a mask is partitioned without its End.",
     "3.2", "", "test/test_fallback.py::test_graph_returning_a_bool_mask", "graph_builder.cpp, build_graph", ""},
    {"partitioning_throws",
     "The pattern matcher can throw std::out_of_range from get_partitions: the block is left to PyTorch.",
     "3.12.0", "", "test/test_fallback.py::test_block_onednn_cannot_partition_runs_unfused",
     "graph_builder.cpp, build_graph", ""},
    // runtime/layouts.cpp and bind.cpp: the layouts handed to oneDNN
    {"copy_transposed_inputs",
     "With a binary op's inputs transposed (or channels-last with binary post-ops), a broadcast post-op is applied along the wrong dim.",
     "3.2 3.11.2 3.12.0 3.13.3", "",
     "test/test_patterns.py::test_transposed_inputs_to_binary_with_broadcast_post_op test/test_patterns.py::test_channels_last_input_to_a_binary_chain",
     "copy_transposed_inputs (runtime/layouts.cpp)", ""},
    {"copy_matmul_post_op_operands",
     "A matmul's binary post-op operand, channels-last and broadcast, is misread.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_patterns.py::test_channels_last_post_op_operand_of_a_matmul",
     "copy_matmul_post_op_operands (runtime/bind.cpp)", ""},
    {"copy_interleaved_matmul_inputs",
     "A matmul input whose batch dims lie between its matrix dims in memory is read wrongly when M == K.",
     "3.12.0", "", "test/test_patterns.py::test_matmul_of_a_permuted_input",
     "copy_interleaved_matmul_inputs (runtime/layouts.cpp)", "avx512"},
    {"canonical_unit_dim_strides",
     "Odd strides of size-1 dims are read as a layout: wrong values, crashes.",
     "3.2 3.11.2 3.12.0 3.13.3", "",
     "test/test_patterns.py::test_permuted_output_with_a_size_one_dim test/test_patterns.py::test_transposed_operand_with_size_one_batch_dims",
     "canonical_unit_dim_strides (runtime/layouts.cpp)", ""},
    {"strided_output_retry",
     "Some partitions (a lone Reorder) compile for no \"any\" output layout: the kernel asks for strided outputs again.",
     "3.12.0", "", "test/test_fuzz.py::test_fuzz", "runtime/kernel.cpp, compile_retrying_with_strided_outputs", ""},
    // runtime.cpp
    {"stale_compiled_partition_cache",
     "The compiled-partition cache can hand a new partition a freed one's kernel, and so its weights: the cache is off.",
     "3.11.2 3.12.0 3.13.3", "", "test/test_memory.py::test_reloaded_models_use_their_own_weights",
     "stale_compiled_partition_cache (runtime.cpp)", ""},
};

constexpr bool names_unique() {
  for (size_t i = 0; i < std::size(kQuirks); ++i)
    for (size_t j = 0; j < i; ++j)
      if (std::string_view(kQuirks[i].name) == kQuirks[j].name) return false;
  return true;
}
static_assert(names_unique(), "two quirks of one name");

// "3.13.3" -> 31303 (major * 10000 + minor * 100 + patch); 0 for "".
int release_number(const char* version) {
  int major = 0, minor = 0, patch = 0;
  if (!version || !*version) return 0;
  std::sscanf(version, "%d.%d.%d", &major, &minor, &patch);
  return major * 10000 + minor * 100 + patch;
}

int onednn_release() {
  static const int release = release_number(llga::onednn::version().c_str());
  return release;
}

// TORCH_LLGA_QUIRKS_OFF's names, read once (spaces around a name ignored).
const std::unordered_set<std::string>& off_list() {
  static const std::unordered_set<std::string> off = [] {
    std::unordered_set<std::string> r;
    const char* env = std::getenv("TORCH_LLGA_QUIRKS_OFF");
    std::stringstream list(env ? env : "");
    for (std::string item; std::getline(list, item, ',');) {
      auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
      if (first != std::string::npos) r.insert(item.substr(first, last - first + 1));
    }
    return r;
  }();
  return off;
}

// Each row's state here, in registry order: not switched off and not fixed in this oneDNN.
const std::vector<bool>& active_rows() {
  static const std::vector<bool> rows = [] {
    std::vector<bool> r;
    const auto& off = off_list();
    for (const Quirk& q : kQuirks) {
      int fixed = release_number(q.fixed_in);
      r.push_back(!off.count(q.name) && !off.count("all") && !(fixed && onednn_release() >= fixed));
    }
    return r;
  }();
  return rows;
}

bool active(const char* name) {
  for (size_t i = 0; i < std::size(kQuirks); ++i)
    if (std::strcmp(kQuirks[i].name, name) == 0) return active_rows()[i];
  TORCH_INTERNAL_ASSERT(false, "torch_llga: no quirk named ", name, " in onednn_quirks.cpp's registry");
}

std::vector<int64_t> sizes(const Value* v) {
  auto t = v->type()->cast<TensorType>();
  auto s = t ? t->sizes().concrete_sizes() : std::nullopt;
  return s ? *s : std::vector<int64_t>{};
}

bool constant_scalar(const Value* v) {
  auto t = v->type()->cast<TensorType>();
  return v->node()->kind() == c10::prim::Constant && t && t->numel() == 1;
}

bool one_element(const Value* v) {
  auto t = v->type()->cast<TensorType>();
  return t && t->numel() == 1;
}

// v's sizes right-aligned to a result of rank r (leading 1s added, as broadcasting reads them):
// [4, 8] against a rank-3 result is [1, 4, 8]. Nullopt if v's sizes are unknown or of higher rank.
std::optional<std::vector<int64_t>> right_aligned(const Value* v, size_t r) {
  auto o = sizes(v);
  if (o.empty() || o.size() > r) return std::nullopt;
  o.insert(o.begin(), r - o.size(), 1);
  return o;
}

// The op of this oneDNN kind that makes v (or null), looking through the elementwise ops oneDNN
// chains after it as post-ops: relu(linear(x)) * c is the same post-op on the same matmul.
const Node* producer(const Value* v, K kind, int depth = 4) {
  const Node* p = v->node();
  const OpEntry* e = find_entry(p);
  if (!e) return nullptr;
  if (e->kind == kind) return p;
  if (depth == 0 || !(e->flags & (kEltwise | kBinary))) return nullptr;
  for (const Value* in : p->inputs())
    if (is_tensor(in))
      if (const Node* found = producer(in, kind, depth - 1)) return found;
  return nullptr;
}

bool fed_by(const Value* v, K kind, int depth = 4) { return producer(v, kind, depth) != nullptr; }

// A linear's matmul (2-D weights) on a 4-D input.
bool linear_of_4d(const Node* matmul) {
  return matmul && matmul->kind() == c10::aten::linear && sizes(matmul->input(0)).size() == 4 &&
         sizes(matmul->input(1)).size() == 2;
}

// Whether oneDNN runs its AVX-512 kernels here (a row's "avx512" kernels; "avx2" ones: the others,
// AVX2 and below). onednn::cpu() names every AVX-512 and AVX10 level "avx512_*".
bool avx512_kernels() { return onednn::cpu().isa.rfind("avx512", 0) == 0; }

}  // namespace

std::span<const Quirk> registry() { return kQuirks; }

bool enabled(const char* name) { return active(name); }

std::string off_list_warning() {
  std::vector<std::string> unknown;
  for (const std::string& name : off_list())
    if (name != "all" && std::none_of(std::begin(kQuirks), std::end(kQuirks), [&](const Quirk& q) { return name == q.name; }))
      unknown.push_back(name);
  if (unknown.empty()) return "";
  std::sort(unknown.begin(), unknown.end());
  std::string msg = "TORCH_LLGA_QUIRKS_OFF names no quirk ";
  for (size_t i = 0; i < unknown.size(); ++i) msg += (i ? ", '" : "'") + unknown[i] + "'";
  msg += " (ignored); the quirks are all, ";
  for (size_t i = 0; i < std::size(kQuirks); ++i) msg += (i ? ", " : "") + std::string(kQuirks[i].name);
  return msg;
}

// A binary post-op of a linear on a 4-D input whose other operand broadcasts along some of
// the output's first three dims but not along all of those over 1 ([2,1,3,8] + [1,1,3,8], or
// [2,1,1,8]) is computed wrongly, off by up to 5 (fuzzing, at sizes other than the traced ones;
// every 2-, 3- and 5-D case is right, and 4-D with a full or a [1,1,1,N] operand). The kernel
// judges a shape-free group's ops again at each new input size (FusionKernel::maps_at), so a
// broadcast the profile did not have is kept out too. PyTorch's built-in fuser gets it wrong.
bool linear_4d_broadcast_post_op(const Node* binary) {
  if (!active("linear_4d_broadcast_post_op")) return false;
  auto out = sizes(binary->output());
  if (out.size() != 4) return false;
  for (size_t i = 0; i < 2; ++i) {
    const Value* other = binary->input(1 - i);
    if (!linear_of_4d(producer(binary->input(i), K::MatMul))) continue;
    auto o = right_aligned(other, out.size());
    if (!o) continue;
    bool broadcast = false, kept = false;
    for (size_t d = 0; d + 1 < out.size(); ++d) {
      if (out[d] == 1) continue;
      ((*o)[d] == 1 ? broadcast : kept) = true;
    }
    if (broadcast && kept) return true;
  }
  return false;
}

// A layer norm followed, in its partition, by an add of a tensor of the output's own sizes
// (which oneDNN makes a "sum" post-op: layer_norm(x) + y) is computed wrongly, off by up to 4.6 at
// BERT's [1, 128, 768] (jit:uni layer_normalization, AMD Zen 4; fuzzing). A broadcast operand (a
// binary post-op) and sub/mul/div are right. PyTorch's built-in fuser gets it wrong too. The same
// add may rightly be a matmul's post-op (BERT's dense + residual, the residual a layer norm's
// output), so the fuser asks this of the partitions oneDNN formed, and the kernel again at new
// input sizes (a broadcast may become a sum).
bool layer_norm_sum_post_op(const Node* binary, const std::unordered_set<const Node*>& partition) {
  if (!active("layer_norm_sum_post_op")) return false;
  const OpEntry* e = find_entry(binary);
  if (!e || e->kind != K::Add) return false;
  auto out = sizes(binary->output());
  for (size_t i = 0; i < 2; ++i) {
    const Node* ln = producer(binary->input(i), K::LayerNorm);
    if (!ln || !partition.count(ln)) continue;
    auto o = right_aligned(binary->input(1 - i), out.size());  // [4, 8] against [1, 4, 8]: the same sum
    if (!out.empty() && o && *o == out) return true;
  }
  return false;
}

// After a batched matmul, an operand broadcast along the last dim ([3,2,8] + [1,2,1]) is
// added wrongly, also with other post-ops between (relu(linear(x)) * c; fuzzing, at a batch size
// other than the traced one). After a 2-D one ([256, 768] * [256, 1], a per-row scale) 3.12.0 is
// right but runs the matmul with its reference kernel: 1188 ms against PyTorch's 1.4 (a sweep of
// patterns, AMD EPYC Zen 5, 2 threads).
bool matmul_last_dim_broadcast_post_op(const Node* binary) {
  if (!active("matmul_last_dim_broadcast_post_op")) return false;
  auto out = sizes(binary->output());
  for (size_t i = 0; i < 2; ++i) {
    const Value* other = binary->input(1 - i);
    if (!fed_by(binary->input(i), K::MatMul)) continue;
    auto o = sizes(other);
    if (out.size() >= 2 && out.back() > 1 && !o.empty() && o.back() == 1 && !one_element(other)) return true;
  }
  return false;
}

// A matmul of one row (every output dim but the last of size 1) with an add of an operand
// of the output's sizes, which oneDNN makes a "sum" post-op (linear(x) + residual, addmm, or + a
// [N] bias at [1, N]), crashes in its fp32 brgemm matmul (its one-row avx2 kernel writes up to 28
// bytes past a 2 KiB buffer, valgrind: a segfault, or "corrupted double-linked list") from about
// K >= 1088 and N >= 512: [1, 2048] x [2048, 1000] + [1, 1000], a batch-1 classifier plus a
// residual; [1, 1, 3072] -> 768, one token through a transformer's MLP (AMD EPYC Zen 5, 1 or 2
// threads; a sweep of 810 large-shape cases found no other). Two rows, a sub or a mul after a
// plain linear, and bf16 (another kernel) were right. Such an fp32 add stays in PyTorch; the
// kernel asks again at new sizes (a batch of 4 traced may come back as 1).
// `test/sweep_ref_kernels.py --big` covers it. 3.13.3 runs the same kernel right (AVX2, an AMD EPYC
// Zen 4 guest).
bool one_row_matmul_sum_post_op(const Node* binary) {
  if (!active("one_row_matmul_sum_post_op")) return false;
  const OpEntry* e = find_entry(binary);
  if (!e || e->kind != K::Add) return false;
  auto t = binary->output()->type()->cast<TensorType>();
  if (t && t->scalarType() && *t->scalarType() != c10::ScalarType::Float) return false;  // unknown: as fp32
  auto out = sizes(binary->output());
  if (out.empty() || std::any_of(out.begin(), out.end() - 1, [](int64_t d) { return d != 1; })) return false;
  for (size_t i = 0; i < 2; ++i) {
    if (!fed_by(binary->input(i), K::MatMul)) continue;
    auto o = right_aligned(binary->input(1 - i), out.size());
    if (o && *o == out) return true;
  }
  return false;
}

// Speed, not values: a convolution's binary post-op whose operand varies per sample but
// not per channel ([2, 1, 1, 1]: a per-sample scale), or per sample and channel after a grouped or
// depthwise convolution ([2, 64, 1, 1]: a diffusion UNet's time embedding), makes oneDNN run the
// convolution with its reference kernel: 329 ms against PyTorch's 0.96 for a 3x3 64->64 conv of
// [2, 64, 56, 56] + [2, 1, 1, 1]; 21.9 against 0.14 ms depthwise + [2, 64, 1, 1] (a sweep of
// patterns, AMD EPYC Zen 5, 2 threads). A dense convolution + [N, C, 1, 1] keeps its brgemm
// kernel. conv1d and conv3d run such an op as a binary primitive with the reference kernel
// ([2, 1, 1] and [2, 1, 1, 1, 1]: up to 14 ms a call, a second sweep). Such an op stays in PyTorch.
bool conv_per_sample_post_op(const Node* binary) {
  if (!active("conv_per_sample_post_op")) return false;
  auto out = sizes(binary->output());
  if (out.size() < 3 || out[0] <= 1) return false;
  for (size_t i = 0; i < 2; ++i) {
    const Node* conv = producer(binary->input(i), K::Convolution);
    if (!conv) continue;
    auto o = sizes(binary->input(1 - i));
    // per sample, not per position
    if (o.size() != out.size() || o[0] != out[0] || std::any_of(o.begin() + 2, o.end(), [](int64_t d) { return d != 1; }))
      continue;
    if (o[1] == 1) return true;
    // groups: _convolution's 9th argument, conv1d/2d/3d's 7th
    size_t at = conv->kind() == c10::aten::_convolution ? 8 : 6;
    auto groups = at < conv->inputs().size() ? torch::jit::constant_as<int64_t>(conv->input(at)) : std::nullopt;
    if (!groups || *groups != 1) return true;
  }
  return false;
}

// Speed, not values: a batched matmul's binary post-op whose operand varies along an inner
// batch dim and along N but is broadcast along M ([2, 8, 64, 64] + [1, 8, 1, 64], per head and
// column: a per-head bias) makes oneDNN run the matmul with its reference kernel (ref:any): 567 ms
// against 0.28 ms for brg_matmul without the add ([1, 12, 128, 768] x [1, 12, 768, 64], AMD EPYC
// Zen 5, 2 threads). Varying along the outermost batch dim only ([2, 1, 1, 64]), along M, or in a 3-D
// matmul ([8, 1, 64]) keeps brg_matmul. Such an op stays in PyTorch.
bool matmul_per_batch_column_post_op(const Node* binary) {
  if (!active("matmul_per_batch_column_post_op")) return false;
  auto out = sizes(binary->output());
  const size_t r = out.size();
  if (r < 4 || out[r - 2] <= 1 || out[r - 1] <= 1) return false;
  for (size_t i = 0; i < 2; ++i) {
    if (!fed_by(binary->input(i), K::MatMul)) continue;
    auto o = right_aligned(binary->input(1 - i), r);  // the post-op's operand
    if (!o || (*o)[r - 2] != 1 || (*o)[r - 1] != out[r - 1]) continue;
    for (size_t d = 1; d + 2 < r; ++d)
      if ((*o)[d] > 1) return true;
  }
  return false;
}

// Speed, not values: a binary op after a convolution whose operand varies along a spatial
// dim but is broadcast along another dim ([1, 64, 56, 56] against the conv's [2, 64, 56, 56]: a
// positional map shared by the batch; [2, 64, 56, 1], [56, 1], ...) runs as a binary primitive of
// its own with oneDNN's reference kernel on the conv's channels-last output: 7.0 ms against
// PyTorch's 0.98 for a 3x3 conv of [2, 64, 56, 56] (a sweep of patterns, AMD EPYC Zen 5, 2
// threads; conv1d and conv3d alike). Full-sized, per-channel and per-sample operands are fast
// (or kept out by conv_per_sample_post_op). Such an op stays in PyTorch.
bool conv_spatial_broadcast_post_op(const Node* binary) {
  if (!active("conv_spatial_broadcast_post_op")) return false;
  auto out = sizes(binary->output());
  if (out.size() < 3) return false;
  for (size_t i = 0; i < 2; ++i) {
    if (!producer(binary->input(i), K::Convolution)) continue;
    auto o = right_aligned(binary->input(1 - i), out.size());
    if (!o) continue;
    bool spatial = std::any_of(o->begin() + 2, o->end(), [](int64_t d) { return d > 1; });
    if (spatial && *o != out) return true;
  }
  return false;
}

// Speed, not values: where(mask, scores, y) after a matmul, the mask or y broadcast
// (a [2, 1, 1, 197] mask and a [1, 1, 1, 1] fill value against [2, 12, 197, 197] scores; GPT-2's
// causal mask is such a where) runs as a binary primitive with oneDNN's reference kernel: 21.6 ms
// against PyTorch's 0.81 (a sweep of patterns, AMD EPYC Zen 5, 2 threads). Full-sized operands
// keep its fast kernel. Such a where stays in PyTorch; the matmul still fuses.
bool matmul_broadcast_select(const Node* where) {
  if (!active("matmul_broadcast_select")) return false;
  if (!fed_by(where->input(1), K::MatMul) && !fed_by(where->input(2), K::MatMul)) return false;
  auto out = sizes(where->output());
  for (const Value* v : where->inputs())
    if (sizes(v) != out) return true;
  return false;
}

// Speed, not values: a binary post-op of a layer norm over a 4-D input whose operand is
// broadcast along the last dim ([2, 12, 197, 768] * [2, 12, 197, 1]) runs as a binary primitive
// with oneDNN's reference kernel: 53 ms against PyTorch's 1.2 (a sweep of patterns, AMD EPYC Zen 5,
// 2 threads); 2-D and 3-D inputs keep the fast kernel. Such an op stays in PyTorch.
bool layer_norm_4d_last_dim_broadcast_post_op(const Node* binary) {
  if (!active("layer_norm_4d_last_dim_broadcast_post_op")) return false;
  auto out = sizes(binary->output());
  if (out.size() < 4 || out.back() <= 1) return false;
  for (size_t i = 0; i < 2; ++i) {
    if (!fed_by(binary->input(i), K::LayerNorm)) continue;
    auto o = sizes(binary->input(1 - i));
    if (!o.empty() && o.back() == 1 && !one_element(binary->input(1 - i))) return true;
  }
  return false;
}

// A binary post-op of a layer norm over a one-element tensor (0.5 + layer_norm(x, (1,))
// with x of size [1, 1]) gives 0 or 1 instead of 0.5 (fuzzing; [1, 2, 1] is right, the layer norm
// alone too). Kept out wherever the last dim is 1: such a layer norm's output is its bias anyway.
bool one_element_layer_norm_post_op(const Node* binary) {
  if (!active("one_element_layer_norm_post_op")) return false;
  // Normalized over a last dim of 1 (the only way to one element: a later call of a shape-free
  // group may bring one element where the profile had more).
  auto out = sizes(binary->output());
  if (out.empty() || out.back() != 1) return false;
  return fed_by(binary->input(0), K::LayerNorm) || fed_by(binary->input(1), K::LayerNorm);
}

// Speed, not values: a matmul with one output column (a matrix-vector product) ran 2-10x
// slower than PyTorch's (DeepAndWide's [64,1,32] x [64,32,1] bmm: 89 against 9 us). 3.12.0, as a
// group: 8.4 against 3.8 us (AMD EPYC Zen 5, 2 threads).
bool matrix_vector_product(const Node* mm) {
  if (!active("matrix_vector_product")) return false;
  auto out = sizes(mm->output());
  return !out.empty() && out.back() == 1;
}

// No bf16 Round kernel: alone it forms no partition, but round + add does and fails to compile
// (fuzzing).
bool bf16_round(const Node* round) {
  if (!active("bf16_round")) return false;
  auto t = round->input(0)->type()->cast<TensorType>();
  return !t || t->scalarType() != c10::ScalarType::Float;
}

// Tensors of more than 5 dims reach oneDNN's reference eltwise kernel, which indexes
// 5 of them: abs(x.reshape(1, 1, 1, 4, 1, 1)) + 1 gave wrong values and wrote past its 16-byte
// output (valgrind; a heap corruption, then a segfault; fuzzing). Such ops stay in PyTorch.
bool above_five_dims(const Node* n, const std::vector<Value*>& inputs) {
  if (!active("above_five_dims")) return false;
  auto big = [](const Value* v) {
    auto t = v->type()->cast<TensorType>();
    return t && t->dim() && *t->dim() > 5;
  };
  return big(n->output()) || std::any_of(inputs.begin(), inputs.end(), big);
}

// Max/avg pooling with a binary post-op on its output computes wrong values (its AVX-512
// kernel; fuzzing) unless the other operand is a constant scalar. The same binary op may rightly be
// a convolution's post-op instead (ResNet's residual add reads a max-pool output), so the fuser asks
// this of the partitions oneDNN formed.
bool pooling_binary_post_op(const Node* binary, const std::unordered_set<const Node*>& partition) {
  if (!active("pooling_binary_post_op")) return false;
  for (size_t i = 0; i < 2; ++i) {
    const Node* producer = binary->input(i)->node();
    if (in_family(producer, kPooling) && partition.count(producer) && !constant_scalar(binary->input(1 - i))) return true;
  }
  return false;
}

// A binary op whose binary post-op's operand is per channel ([1, C, 1, ..]) on an output of
// three or more dims, N > 1 and every dim after C of size 1 ([N, C, 1, 1]), applies one channel's
// value to all (jit:uni binary; ((x * 2) + c).relu() at [256, 1024, 1, 1] off by up to 20 in default
// settings; a convolution's or matmul's post-ops, 2-D, N = 1 or any spatial dim > 1 are right;
// fuzzing, on Zen 4). Such a post-op stays in PyTorch.
bool per_channel_post_op_at_unit_spatial(const Node* binary, const std::unordered_set<const Node*>& partition) {
  if (!active("per_channel_post_op_at_unit_spatial")) return false;
  auto out = sizes(binary->output());
  if (out.size() < 3 || out[0] <= 1 || out[1] <= 1 || std::any_of(out.begin() + 2, out.end(), [](int64_t d) { return d != 1; }))
    return false;
  // A post-op of a binary main op: the partition has another binary op and no contraction, and
  // this one reads a value computed in the partition (not a constant: the kernel's check at new
  // sizes passes the group's whole subgraph, its constants included).
  bool other_binary = false;
  for (const Node* n : partition) {
    if (in_family(n, kContraction)) return false;
    other_binary |= n != binary && is_binary_op(n);
  }
  if (!other_binary) return false;
  for (size_t i = 0; i < 2; ++i) {
    const Node* producer = binary->input(i)->node();
    if (producer->kind() == c10::prim::Constant || !partition.count(producer)) continue;
    auto o = right_aligned(binary->input(1 - i), out.size());  // the post-op's operand
    if (o && (*o)[0] == 1 && (*o)[1] == out[1]) return true;
  }
  return false;
}

// Slow, not wrong: a binary op whose operand computed in the partition is per channel,
// [N, C, 1, 1], broadcast up to the other operand from outside the partition, [N, C, H, W]
// (squeeze-and-excitation: x * hardsigmoid(conv(pool(x)))), can be no post-op: oneDNN runs it as a binary primitive of its own (jit:uni; channels-last, per-channel
// broadcast), 30-130 us a MobileNetV3 block where PyTorch's mul takes 5-9 us (Zen 4, 2 threads).
// Such an op stays in PyTorch, x handed to it in channels-last strides (layout_propagation.cpp).
// A speed rule: the fuser's only, not asked at new sizes.
bool broadcast_up_post_op(const Node* binary, const std::unordered_set<const Node*>& partition) {
  if (!active("broadcast_up_post_op")) return false;
  // As measured: a per-channel [N, C, 1, 1] value of the partition times an outside [N, C, H, W].
  auto out = sizes(binary->output());
  if (out.size() != 4 || out[2] * out[3] <= 1) return false;
  for (size_t i = 0; i < 2; ++i) {
    const Value* mine = binary->input(i);
    const Value* other = binary->input(1 - i);
    if (!partition.count(mine->node()) || partition.count(other->node()) || other->node()->kind() == c10::prim::Constant) continue;
    auto m = sizes(mine);
    if (m.size() == 4 && m[0] == out[0] && m[1] == out[1] && m[2] == 1 && m[3] == 1) return true;
  }
  return false;
}

// An int8 conv whose sum post-op reads the conv's own (dequantized) input, conv(y) + y,
// does not compile ("could not create a primitive descriptor for the reorder primitive"; v3.2
// compiled it). Such an add keeps the conv's requantization and runs in PyTorch.
bool int8_sum_of_own_input(const Value* residual, const Node* conv) {
  if (!active("int8_sum_of_own_input")) return false;
  return residual->node()->kind() == c10::aten::dequantize && conv->input(0)->node()->kind() == c10::aten::dequantize &&
         residual->node()->input(0) == conv->input(0)->node()->input(0);
}

// A matmul's binary post-op whose operand is channels-last and broadcast ([1, 2, 1, 8]
// times the matmul's [2, 2, 1, 8]; mul or add) reads it wrongly: off by up to 19 (fuzzing, on Zen
// 4). A full-sized one is right, and so are a convolution's. In a group with a matmul, inputs a
// binary op reads go to oneDNN contiguous (runtime/bind.cpp).
bool copy_matmul_post_op_operands() {
  static const bool on = active("copy_matmul_post_op_operands");
  return on;
}

// With a binary op's inputs and output all transposed (dense, permuted strides), a broadcast
// post-op is applied along the wrong dim ((a.t() * b.t()) * c; relu(linear(x)) * c at new sizes;
// fuzzing). Such inputs are copied to contiguous first (inputs read only by convs and matmuls of
// a group without binary ops are not: a transposed conv1d input is the layout the conv wants).
// 3.12.0 does the same with channels-last inputs (and channels-last LLGA tensors) of a binary op
// with binary post-ops, where a post-op operand broadcasts along the last dim: c + x * 2 was off
// by up to 17, (x * b) + c crashed (fuzzing, on Zen 4): a group whose main op is binary
// (runtime/layouts.cpp, binary_chain_of_binaries) gets its inputs contiguous.
// A reduction reads its inputs contiguous: a group writing one for it writes it so, and the kernel
// copies any other layout first (a copy costs a fraction of the reference kernel).
bool reduction_reads_plain() {
  static const bool on = active("reduction_reads_plain");
  return on;
}

// A reduction over dims that are not the innermost ones (of a plain layout: reduction_reads_plain):
// 2x64x28x28 reduced over dim 1 took 1.3 ms, 70x PyTorch's time; over dims 2 and 3, 19 us.
bool reduction_of_outer_dims(const std::vector<int64_t>& axes, int64_t rank) {
  if (!reduction_reads_plain()) return false;
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[axes.size() - 1 - i] != rank - 1 - static_cast<int64_t>(i)) return true;
  return false;
}

namespace {
thread_local int values_only = 0;
thread_local SpeedRuleTrial* trial = nullptr;
thread_local int fusing = 0;

// A measured speed rule that would keep `op` from oneDNN: it does in the fuser (a group formed
// without it), unless a trial is on there, which lists the op instead. Elsewhere (a group's ops
// mapped again at new sizes, for values) it keeps nothing out: the group is what timing chose.
bool applies_unless_on_trial(const Node* op, const char* rule) {
  if (!fusing) return false;
  if (!trial) return true;
  trial->held_back.emplace_back(op, rule);
  return false;
}
}  // namespace

ValuesOnly::ValuesOnly() { ++values_only; }
ValuesOnly::~ValuesOnly() { --values_only; }

SpeedRuleTrial::SpeedRuleTrial() : outer_(trial) { trial = this; }
SpeedRuleTrial::~SpeedRuleTrial() { trial = outer_; }
SpeedRuleTrial* SpeedRuleTrial::current() { return trial; }

Fusing::Fusing() { ++fusing; }
Fusing::~Fusing() { --fusing; }

// Group norm stays in PyTorch (AMD EPYC Zen 4, AVX2, 2 threads; on a conv's output, where oneDNN
// hands it channels-last, conv + group norm + SiLU ran level with PyTorch at 32 channels, 28x28).
bool group_norm_slow_kernel(const Node* group_norm) {
  static const bool on = active("group_norm_slow_kernel");
  return on && applies_unless_on_trial(group_norm, "group_norm_slow_kernel");
}

// Speed, not values: a GELU (erf or tanh) applied as the post-op of an fp32 matmul or linear by
// oneDNN's AVX2 brgemm kernels adds 1.15-1.25 ms (erf) and 1.95-2.1 ms (tanh) to a 128x768 x
// 768x3072 linear of 4.7-5.35 ms, where PyTorch's GELU of that output in place adds 0.5 and 0.7 ms;
// at 197 rows (ViT-B/16) +1.7 against +0.7 ms; at 32 rows +0.24 against +0.15; at 8 rows (24K
// outputs) the post-op is the cheaper (AMD EPYC Zen 3, 2 threads, oneDNN 3.12.0, in-process
// alternation). So a GELU of 64K outputs or more stays in PyTorch on CPUs without AVX-512 (the
// AVX-512 kernels were not measured slow), in place on the group's output (InPlaceActivations).
// BERT-base, DistilBERT, ViT-B/16: 2-4% faster.
constexpr int64_t kGeluPostOpSlowFrom = 1 << 16;


bool gelu_post_op_slow(const Node* gelu) {
  if (values_only || !active("gelu_post_op_slow") || avx512_kernels()) return false;
  auto t = gelu->input(0)->type()->cast<TensorType>();
  auto n = t ? t->numel() : std::nullopt;
  return n && *n >= kGeluPostOpSlowFrom && t->scalarType() == at::kFloat && producer(gelu->input(0), K::MatMul, 1) &&
         applies_unless_on_trial(gelu, "gelu_post_op_slow");
}

// oneDNN's layer norm writes a Quantize's u8 output, its scale and zero point as binary post-ops,
// only in its reference kernel (simple:any): [1, 197, 768] took 6.8 ms (zero point 0) and 18.5 ms
// (zero point 10) against 0.06 ms for the jit:uni layer norm alone (AVX2, 3.12.0): ViT-B/16
// quantized by PT2E ran at half its fp32 speed. Its eltwise post-ops stay in jit:uni, so only the
// Quantize is kept apart (it reads the layer norm's output, or a clamp of it).
bool layer_norm_quantized_output(const Node* quantize) {
  if (values_only || !active("layer_norm_quantized_output")) return false;
  return producer(quantize->input(0), K::LayerNorm) != nullptr;
}

// A 1-D or 3-D pooling reads a plain input channels-last (the kernel copies it): average pooling of
// 4x128x512, kernel 3, stride 2: 1.3 ms with simple_nchw, 48 us from nwc, PyTorch 53 us (AMD EPYC
// Zen 4, 2 threads).
bool pooling_reads_channels_last() {
  static const bool on = active("pooling_reads_channels_last");
  return on;
}

// Even from channels-last, the copy there costs more than PyTorch's pooling of the plain input (max
// pooling of 4x128x512: 0.55 ms against 0.12): a 1-D or 3-D pooling of what an op PyTorch runs
// produces stays in PyTorch. A graph input passes: in a group's subgraph (judged again at new sizes)
// it is what another group, a convolution, produced in oneDNN's layout; a model input pooled first
// thing is copied channels-last (the rare case the copy is for).
bool pooling_of_a_plain_input(const Node* pool) {
  if (!pooling_reads_channels_last()) return false;
  auto t = pool->input(0)->type()->cast<TensorType>();
  if (!t || !t->dim() || (*t->dim() != 3 && *t->dim() != 5)) return false;
  const Node* producer = pool->input(0)->node();
  return producer->kind() != c10::prim::Param && !map_node(producer);
}

bool copy_transposed_inputs() {
  static const bool on = active("copy_transposed_inputs");
  return on;
}

// A matmul input whose batch dims lie between its matrix dims in memory (a [B,K,H,M]
// tensor permuted to [B,H,M,K]: strides [.., M, 1, H*M]) is read wrongly when M == K, off by up to
// 1e33 (reads outside the tensor; fuzzing). Such square inputs are copied to contiguous first; a
// transposed matrix with its batch dims outermost is read right, and so is a non-square one (its
// fault was never seen: on Zen 4 with 3.12.0 no shape of 1,350 read wrongly with the copies off,
// square ones included). Attention's q, k and v ([L, D] views of a projection's output) go in
// place unless L == D.
// The fault was found in AVX-512 kernels; their AVX2 twins read such inputs right (probed on
// 3.11.2, 3.12.0 and 3.13.3: docs/quirks.md), so CPUs without AVX-512 skip the copies (BERT's
// attention reads three projections' transposed views a layer).
bool copy_interleaved_matmul_inputs() {
  static const bool on = active("copy_interleaved_matmul_inputs") && avx512_kernels();
  return on;
}

// oneDNN reads a layout from every stride, also of size-1 dims, which address nothing. v3.2 crashed compiling an add of a [1] slice of stride 2, and read a channels-last int8
// tensor with N = 1 whose N stride was not the outermost as "cdab" (int8 max-pool then ran its
// reference kernel, 100x slower); 3.12 handles both (test_fallback.py::test_size_one_dims_with_any_stride,
// test_int8.py::test_int8_kernels_are_not_reference_ones), but computes wrong values where its own
// output carries such a stride: linear -> permute gives [2, 1, 8] with strides [8, 16, 1], and an
// add reading that was off by up to 1.2 (fuzzing).
// Such strides go to oneDNN canonical: outside every later dim (a stride tying with a permuted
// dim's, [.., k, 1, k] for a transposed [2,1,1,k,2], was misread too: fuzzing).
bool canonical_unit_dim_strides() {
  static const bool on = active("canonical_unit_dim_strides");
  return on;
}

// An fp32 2-D convolution of a single input channel whose output is one column wide
// with a stride above 1 along the width (conv2d of [1, 1, 6, 1] by a 3x3 kernel, stride (1, 2),
// padding (0, 1)) leaves output elements unwritten in its brgemm kernel (brg_conv_fwd): garbage or
// NaN where the output buffer's memory held them, 51 of 1,344 such shapes swept (fuzzing, Zen 4).
// bf16, several input channels (depthwise included) and conv1d were right. Such convolutions stay
// in PyTorch, also at new sizes (the kernel asks the mapping again).
bool one_channel_unit_width_conv(const Node* conv, const std::vector<int64_t>& stride) {
  if (!active("one_channel_unit_width_conv")) return false;
  auto x = conv->input(0)->type()->cast<TensorType>();
  auto in = sizes(conv->input(0)), out = sizes(conv->output());
  return x && x->scalarType() == c10::ScalarType::Float && in.size() == 4 && out.size() == 4 && stride.size() == 2 &&
         in[1] == 1 && out[3] == 1 && stride[1] > 1;
}

// Every CPU without VNNI (AVX2, or AVX-512 without VNNI; a KVM guest of an AMD
// EPYC Zen 4 that hides AVX-512 is one): oneDNN's int8 matmul (gemm:jit) multiplies u8 activations by
// s8 weights with vpmaddubsw, which adds each pair of products into a saturating 16-bit integer
// (255 * 127 * 2 > 32767). With activations that use all 8 bits, as PyTorch's observers make them
// unless reduce_range is set, a quantized linear came out 14-53 output steps off the reference
// (42 steps at [4, 64] -> 128; exact with reduce_range's 7-bit activations). The int8 weights then
// stay PyTorch's (dequantized there): the conv or matmul runs in fp32, right, and still fused. Not
// where the src's codes are known below 128 (op_table.cpp's int8_weights_exact: PT2E's reduce_range).
bool int8_without_vnni() {
  static const bool on = active("int8_without_vnni") && !llga::onednn::cpu().int8_vnni;
  return on;
}

// oneDNN's conv patterns check each input's producer for an f8 Dequantize
// (check_f8_conv_with_no_scale_and_zp) and stop at the first that is not a Dequantize; with a
// Dequantize feeding the src, they go on to the weights' producer, which a weight given as an input
// of the partition does not have: a null dereference, a segfault in get_partitions. Reached by an
// int8 model whose weights oneDNN does not take as int8 (no VNNI, zero points: fp32 constants,
// prepare_quantization.cpp): the src's dequantize then stays in PyTorch.
bool dequantized_src_of_fp32_conv() {
  static const bool on = active("dequantized_src_of_fp32_conv");
  return on;
}

// A bf16 convolution with a size-1 kernel, dilation 2 and stride 2 (conv1d of a [2, 8, 1]
// input, padding 1) segfaults in its brgemm kernel (brgemm_convolution_fwd_t::perform_outwork;
// fuzzing). Dilation means nothing along a size-1 kernel dim: it is given to oneDNN as 1.
// On Zen 4 fp32 too: a grouped conv of two input channels a group runs brg_conv_fwd:avx2 there
// ([1, 4, 4, 1], w [6, 2, 3, 1], stride (1, 2), padding (1, 1), dilation (2, 2); a null kernel).
bool dilated_unit_kernel() {
  static const bool on = active("dilated_unit_kernel");
  return on;
}

// oneDNN's global compiled-partition cache keys an entry by raw pointers to the ops of the
// partition it was compiled from, compared by value through those pointers. Once that graph is
// freed (a module torch.jit.load made and dropped: its compilation unit goes with it), a new
// partition whose ops land at the same addresses with equal contents finds the old entry, and its
// kernel reads the constant weight cache under the old partition's key: the new model ran with the
// freed one's weights (34 of 40 reloads of models of one architecture, other weights; found by the
// fuzzer once it freed each example's code). torch_llga keeps its own compiled partitions per group,
// so the cache is turned off (runtime.cpp).
bool stale_compiled_partition_cache() { return active("stale_compiled_partition_cache"); }

}  // namespace llga::quirks
