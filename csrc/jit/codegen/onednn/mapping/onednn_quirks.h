#pragma once
// Every oneDNN fault torch_llga works around, in one place: a registry (kQuirks in
// onednn_quirks.cpp), one row a workaround, with its name, the fault, the oneDNN versions it was
// seen on and fixed in, its regression tests and where the workaround lives. Most rows also have a
// predicate here: true where the fault would be hit, so the caller keeps that op (or layout) away
// from oneDNN. The others' code asks enabled("name").
//
// TORCH_LLGA_QUIRKS_OFF=name[,name...] (or "all") turns workarounds off, to re-test them on a new
// oneDNN; never for production use. A workaround is off by itself on the oneDNN release its row
// says the fault is gone from, and after. test/test_quirks.py runs each row's regression tests with
// it off; test/quirk_probes.py probes the fault itself; docs/quirks.md has both per oneDNN version.
#include <torch/csrc/jit/ir/ir.h>

#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace llga::quirks {

using torch::jit::Node;

// One row of the registry.
struct Quirk {
  const char* name;
  const char* fault;     // what oneDNN does wrong, one sentence
  const char* seen_on;   // the oneDNN versions the fault showed on, space-separated
  const char* fixed_in;  // the first version the fault is gone from ("": none); the workaround is off there and after
  const char* test;      // its regression tests, pytest node ids from the repository root, space-separated
  const char* asked_in;  // where the workaround is: its predicate, or the code that asks enabled()
  const char* kernels;   // "": any CPU; else the kernels the fault was seen in ("avx512", "bf16"), which other CPUs never run
  // A speed rule the machine at hand decides by timing (SpeedRuleTrial below): false for a
  // correctness rule, and for a speed rule whose slow side is a reference kernel (timing it costs
  // 100-2000x the op, and no CPU was seen to run it fast).
  bool measured = false;
};

std::span<const Quirk> registry();

// Whether the workaround of this name applies here (not switched off, not fixed in this oneDNN).
// The name must be a row's (an internal error otherwise).
bool enabled(const char* name);

// Non-empty when TORCH_LLGA_QUIRKS_OFF names something that is no quirk: the warning, with the
// valid names (the module's import shows it).
std::string off_list_warning();

// op_table.cpp: mappings refused.
bool matmul_last_dim_broadcast_post_op(const Node* binary);  // matmul(..) + [.., 1]: wrong (2-D: reference kernel)
bool one_element_layer_norm_post_op(const Node* binary);     // layer_norm(1 element) + c: wrong
bool linear_4d_broadcast_post_op(const Node* binary);       // linear(4-D) + [1,1,3,8] at [2,1,3,8]: wrong
bool matmul_per_batch_column_post_op(const Node* binary);  // matmul(4-D) + [1,H,1,N]: reference kernel
bool conv_per_sample_post_op(const Node* binary);          // conv + [N,1,1,1] (grouped: [N,C,1,1]): reference kernel
bool conv_spatial_broadcast_post_op(const Node* binary);   // conv(..) + [1,C,H,W] at N > 1, [N,C,H,1], ...: reference kernel
bool matmul_broadcast_select(const Node* where);           // where(mask, matmul, y), mask or y broadcast: reference kernel
bool layer_norm_4d_last_dim_broadcast_post_op(const Node* binary);  // layer_norm(4-D) * [.., 1]: reference kernel
bool one_row_matmul_sum_post_op(const Node* binary);      // matmul(1 row) + [1, N]: crashes
bool matrix_vector_product(const Node* matmul);           // N = 1: several times slower than PyTorch
bool bf16_round(const Node* round);                       // no bf16 Round kernel: fails to compile
bool above_five_dims(const Node* n, const std::vector<torch::jit::Value*>& inputs);  // reference kernels overrun
// fp32 conv2d of one input channel, output width 1, stride along W > 1: an output element unwritten
bool one_channel_unit_width_conv(const Node* conv, const std::vector<int64_t>& stride);
// A reduction over these axes (sorted) of a tensor of this rank: not its innermost dims.
bool reduction_of_outer_dims(const std::vector<int64_t>& axes, int64_t rank);

// op_table.cpp: int8 weights stay PyTorch's (the conv or matmul then runs in fp32) on a CPU whose
// oneDNN kernels lack VNNI: their u8 x s8 products saturate in 16-bit pairs.
bool int8_without_vnni();
bool dequantized_src_of_fp32_conv();  // op_table.cpp: a Dequantize feeding a conv whose weights no op makes

// op_table.cpp: a convolution's dilation is 1 along its size-1 kernel dims (the same convolution).
bool dilated_unit_kernel();

// op_table.cpp: ops left to PyTorch where oneDNN's kernel is slower than PyTorch's.
bool gelu_post_op_slow(const Node* gelu);   // gelu(matmul(..)), fp32, AVX2 kernels: slower than PyTorch's
bool layer_norm_quantized_output(const Node* quantize);  // quantize(layer_norm(..)): a reference kernel
// While one is alive (on this thread), rules that keep an op from oneDNN for speed alone
// (gelu_post_op_slow, layer_norm_quantized_output) hold back: a group fused at its profiled sizes
// is judged again at new ones for values only (runtime/new_sizes.cpp), not sent unfused for being
// slower there.
struct ValuesOnly {
  ValuesOnly();
  ~ValuesOnly();
};
bool group_norm_slow_kernel(const Node* group_norm);  // any group norm

// While one is alive on this thread, the measured speed rules (the registry's `measured` rows:
// gelu_post_op_slow, group_norm_slow_kernel) keep nothing from oneDNN and list the ops they would
// have kept: FuseGraph fuses them, and the speed_choices pass gives each such group a second form
// with the rule applied, the faster form chosen by timing both (llga::SpeedChoice).
// The measured speed rules keep ops out of groups only while the fuser runs (one of these alive on
// the thread): a group's ops mapped again at other sizes are judged for values alone.
struct Fusing {
  Fusing();
  ~Fusing();
};
struct SpeedRuleTrial {
  SpeedRuleTrial();
  ~SpeedRuleTrial();
  static SpeedRuleTrial* current();  // this thread's, or null
  std::vector<std::pair<const Node*, const char*>> held_back;  // the op, the rule's name

 private:
  SpeedRuleTrial* outer_;
};
bool pooling_of_a_plain_input(const Node* pool);  // a 1-D or 3-D pooling no oneDNN op feeds

// graph_fuser.cpp: binary ops sharing a partition with the pooling they read.
bool pooling_binary_post_op(const Node* binary, const std::unordered_set<const Node*>& partition);
// layer_norm(x) + y in one partition, y of the output's sizes (oneDNN's sum post-op): wrong.
bool layer_norm_sum_post_op(const Node* binary, const std::unordered_set<const Node*>& partition);
// A binary op's post-op with a per-channel operand at [N > 1, C, 1, ..]: wrong.
bool per_channel_post_op_at_unit_spatial(const Node* binary, const std::unordered_set<const Node*>& partition);
// Any of the three above: asked by the fuser of each partition, and by the kernel at new sizes.
inline bool wrong_in_partition(const Node* binary, const std::unordered_set<const Node*>& partition) {
  return pooling_binary_post_op(binary, partition) || layer_norm_sum_post_op(binary, partition) ||
         per_channel_post_op_at_unit_spatial(binary, partition);
}
// Slow, not wrong (the fuser's only): a partition's [N, C, 1, 1] value broadcast up to an outside
// [N, C, H, W] by a binary op, squeeze-and-excitation's scale.
bool broadcast_up_post_op(const Node* binary, const std::unordered_set<const Node*>& partition);

// prepare_quantization.cpp: an int8 conv/linear whose residual add reads the conv's own input.
bool int8_sum_of_own_input(const torch::jit::Value* residual, const Node* conv);

// runtime/layouts.cpp and bind.cpp: the layouts handed to oneDNN.
bool copy_transposed_inputs();      // a binary op's broadcast post-op along the wrong dim
bool copy_matmul_post_op_operands();  // a matmul's post-op operand, channels-last and broadcast: misread
bool canonical_unit_dim_strides();  // odd strides of size-1 dims: wrong values, a crash
bool copy_interleaved_matmul_inputs();  // batch dims between a matmul input's matrix dims: wrong values
bool reduction_reads_plain();       // a reduction of a channels-last or blocked input: reference kernel
bool pooling_reads_channels_last();  // a 1-D or 3-D pooling of a plain input: a slow kernel

// runtime.cpp: oneDNN's compiled-partition cache, off (it can hand a new partition a freed one's
// compiled kernel, and so the freed module's weights).
bool stale_compiled_partition_cache();

}  // namespace llga::quirks
