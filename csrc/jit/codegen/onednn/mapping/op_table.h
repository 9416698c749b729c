#pragma once
// The op mapping: one entry per aten schema -> oneDNN Graph op, with its attributes and the
// conditions under which the mapping holds. Adding an op is one entry in op_table.cpp (and a test).
#include <torch/csrc/jit/ir/ir.h>

#include <oneapi/dnnl/dnnl_graph.hpp>

#include "jit/codegen/onednn/mapping/dtypes.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace llga {

using torch::jit::Node;
using torch::jit::Value;
using dnnl::graph::op;

using AttrValue = std::variant<int64_t, float, bool, std::string, std::vector<int64_t>, std::vector<float>>;

// What one JIT node becomes in oneDNN: an op kind, the JIT values feeding it (in oneDNN's input
// order) and its attributes.
struct OpSpec {
  op::kind kind = op::kind::Wildcard;
  std::vector<Value*> inputs;
  std::vector<std::pair<op::attr, AttrValue>> attrs;
  // The op holds only for the profiled sizes (a reshape to them, say): its group cannot be
  // recompiled for other input sizes, so a new shape takes the unfused fallback.
  bool shape_specific = false;
  // ... of its spatial sizes only (dims 2..: a pooling's output size, an adaptive pool's windows):
  // another batch size (dim 0) recompiles it as for any op.
  bool spatial_only = false;
  // Why the builder refused the node, where a reason of its own says more than "outside the
  // mapping's conditions" (a quirk, a mode oneDNN lacks): explain() shows it.
  const char* refused = nullptr;

  OpSpec& in(Value* v) { inputs.push_back(v); return *this; }
  bool refuse(const char* why) { refused = why; return false; }
  template <typename T>
  OpSpec& attr(op::attr a, T v) { attrs.emplace_back(a, std::move(v)); return *this; }  // no variant temporary:
  // moving one that holds a vector makes GCC 12 warn -Wmaybe-uninitialized (a false positive)
};

enum OpFlags : unsigned {
  kNone = 0,
  kWorthAlone = 1u << 0,        // a partition of this op alone is still worth a group (compute-bound)
  kShapePreserving = 1u << 1,   // output has the input's sizes: aten::size may read the input instead
  kCastsDtype = 1u << 2,        // input and output dtypes differ by design (TypeCast)
  // NaN/Inf in, NaN/Inf out where eager has them (arithmetic and data movement): a group of only
  // such ops needs no scan of its inputs. Activations, pooling, softmax and norms do not: oneDNN's
  // ReLU, Clamp and max-pool (and its polynomial approximations) can turn NaN into numbers.
  kKeepsNaN = 1u << 3,
  // A bf16 op may take its parameters (every input after the first) in fp32: batch norm's running
  // statistics stay fp32 in models traced under autocast (DenseNet's cat -> batch_norm -> relu).
  kFloatParams = 1u << 4,
  // Families, one flag each, which passes and quirks ask with in_family() (never by listing ops):
  kContraction = 1u << 5,  // convolution, matmul: the ops post-ops attach to
  kPooling = 1u << 6,      // max/avg pooling
  kEltwise = 1u << 7,      // unary elementwise: a post-op
  kBinary = 1u << 8,       // elementwise binary (Add, Multiply, Select, ...): a post-op
  // Arithmetic binary ops (prepare_binary, type inference): two operands of one dtype broadcast to
  // the output; the Scalar overload's operand becomes a tensor. Additive ones (add, sub) have an
  // alpha argument and leave x unchanged by 0; multiplicative ones (mul, div) by 1.
  kAdditive = 1u << 9,
  kMultiplicative = 1u << 10,
  // Every output element is computed from the same-index elements of the (broadcast) inputs: the
  // values do not depend on the strides (layout_propagation hands such ops channels-last tensors).
  kStrideAgnostic = 1u << 11,
  // The output's elements are the input's, rearranged or selected (a view or a copy of one): a
  // value scanned for NaN/Inf need not be scanned again through it (guard_shapes).
  kView = 1u << 12,
  // Type inference: the output of a 2-D matrix product, [M, K] x [K, N] -> [M, N] (type_inference).
  kMatrixProduct2d = 1u << 13,
  // No oneDNN mapping of its own, but its in-place form (silu_, addmm_) is still made functional
  // (remove_mutation): a small-graph plan can run it. Ops oneDNN maps always are.
  kFunctionalForm = 1u << 14,
  kReduction = 1u << 15,  // ReduceMean, ReduceSum, ReduceMax, ReduceMin over dims (a family)
};

// The small-graph plan's computation for an op (small_plan/): which of its steps runs this schema.
// kNone: the plan has no step for it.
enum class PlanStep : uint8_t {
  kNone,
  // elementwise, one Fn each
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum,
  kRelu, kAbs, kSquare, kSqrt, kLog, kHardSigmoid, kHardSwish, kSilu, kSigmoid, kTanh, kExp, kNeg,
  // elementwise with arguments
  kRelu6, kGelu, kElu, kClamp, kLeakyRelu,
  // layouts (no computation unless a copy is needed)
  kTranspose, kT, kPermute, kUnsqueeze, kSqueeze, kReshape, kContiguous, kDropout, kCat,
  // matrix products
  kMatmul, kLinear, kAddmm,
};

struct OpEntry {
  const char* schema;        // the exact registered aten schema
  op::kind kind;             // Wildcard: no oneDNN mapping (the entry holds the op's other facts)
  unsigned flags;
  // Reads inputs and attributes off the node into spec; false when this node does not fit
  // (a condition of the mapping fails), and it then stays in PyTorch. Null: no oneDNN mapping.
  bool (*build)(const Node* n, OpSpec& spec);
  PlanStep plan_step = PlanStep::kNone;
  bool maps_to_onednn() const { return build != nullptr; }
};

// Partitions of only cheap ops (elementwise, reshapes) pay for a group's fixed cost (guard, branch,
// oneDNN execution) from about this many elements on (measured on this project's machine).
constexpr int64_t kMinElementsForCheapGroup = 256 * 1024;
constexpr size_t kMinOpsForCheapGroup = 3;

const std::vector<OpEntry>& op_table();

// The name of one OpFlags bit ("kWorthAlone"), or null.
const char* flag_name(unsigned bit);
// The oneDNN Graph op's name ("MatMul"), for the docs the table prints.
const char* kind_name(op::kind kind);

// The entry whose schema the node has, if any (conditions not checked).
const OpEntry* find_entry(const Node* n);

// The oneDNN op for this node, or nullopt if it stays in PyTorch. Checks the entry's conditions
// and the common ones: CPU, a dtype oneDNN takes (dtypes.h), fully profiled (complete) sizes and
// strides, no empty tensors. With `why`, the reason it gives nothing, in words for
// torch_llga.explain() (as unmapped_reason).
std::optional<OpSpec> map_node(const Node* n, std::string* why = nullptr);

// Why map_node(n) gives nothing, in words for torch_llga.explain(); empty if n maps.
std::string unmapped_reason(const Node* n);

// Each node of a block mapped once: its spec, or why it has none. The fuser's graph builds (one
// per exclusion round) and its explain marks share one per block; nodes are never re-typed while
// it lives.
class BlockMappings {
 public:
  const OpSpec* spec(const Node* n) { return get(n).spec ? &*get(n).spec : nullptr; }
  const std::string& reason(const Node* n) { return get(n).why; }

 private:
  struct Mapping {
    std::optional<OpSpec> spec;
    std::string why;
  };
  const Mapping& get(const Node* n);
  std::unordered_map<const Node*, Mapping> by_node_;
};

// Whether n's table entry (conditions not checked) is of this family (kContraction, kPooling,
// kEltwise, kBinary).
bool in_family(const Node* n, unsigned families);

// Whether n maps to an elementwise binary op (Add, Multiply, ...): a post-op when it follows a
// compute op in a partition.
inline bool is_binary_op(const Node* n) { return in_family(n, kBinary); }

// Whether one of the table's overloads of this op kind has a oneDNN mapping.
bool kind_maps_to_onednn(c10::Symbol kind);

// Whether an in-place op (relu_) is worth making functional (relu) for the fuser: an overload of
// the functional kind maps to oneDNN, or its entry has kFunctionalForm.
bool functional_form_fuses(c10::Symbol kind);

// The flags every table entry of this node kind has (any overload: aten::add.Scalar and .Tensor
// alike), 0 if the table has none. For passes that handle all overloads of an op.
unsigned kind_flags(c10::Symbol kind);

// The oneDNN op kind n's table entry maps to (conditions not checked), or Wildcard.
op::kind onednn_kind(const Node* n);

// The scale and zero point of an aten::quantize_per_tensor node, if they are constants.
struct QuantParams {
  double scale;
  int64_t zero_point;
};
std::optional<QuantParams> quantize_params(const Node* n);

// A dequantize's input quantization parameters, recorded on the node by PrepareQuantization from
// the quantize that produced the input (the dequantize may later sit in a group without it).
inline const c10::Symbol kQuantScale = c10::Symbol::attr("llga_scale");
inline const c10::Symbol kQuantZeroPoint = c10::Symbol::attr("llga_zero_point");
// ... and, where a clamp (PT2E's reduce_range), or a pool, view or ReLU of codes so bounded, caps
// that quantize's input, the largest u8 code it can give (int8_without_vnni spares codes below 128).
inline const c10::Symbol kQuantMaxCode = c10::Symbol::attr("llga_max_code");

bool is_tensor(const Value* v);

}  // namespace llga
