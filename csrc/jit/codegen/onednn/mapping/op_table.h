#pragma once
// The op mapping: one entry per aten schema -> oneDNN Graph op, with its attributes and the
// conditions under which the mapping holds. Adding an op is one entry in op_table.cpp (and a test).
#include <torch/csrc/jit/ir/ir.h>

#include <oneapi/dnnl/dnnl_graph.hpp>

#include <optional>
#include <string>
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

  OpSpec& in(Value* v) { inputs.push_back(v); return *this; }
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
};

struct OpEntry {
  const char* schema;        // the exact registered aten schema
  op::kind kind;
  unsigned flags;
  // Reads inputs and attributes off the node into spec; false when this node does not fit
  // (a condition of the mapping fails), and it then stays in PyTorch.
  bool (*build)(const Node* n, OpSpec& spec);
};

// Partitions of only cheap ops (elementwise, reshapes) pay for a group's fixed cost (guard, branch,
// oneDNN execution) from about this many elements on (measured on this project's machine).
constexpr int64_t kMinElementsForCheapGroup = 256 * 1024;
constexpr size_t kMinOpsForCheapGroup = 3;

const std::vector<OpEntry>& op_table();

// The entry whose schema the node has, if any (conditions not checked).
const OpEntry* find_entry(const Node* n);

// The oneDNN op for this node, or nullopt if it stays in PyTorch. Checks the entry's conditions
// and the common ones: CPU, fp32/bf16, fully profiled (complete) sizes and strides, no empty tensors.
std::optional<OpSpec> map_node(const Node* n);

// Why map_node(n) gives nothing, in words for torch_llga.explain(); empty if n maps.
std::string unmapped_reason(const Node* n);

// Whether n's table entry (conditions not checked) is of this family (kContraction, kPooling,
// kEltwise, kBinary).
bool in_family(const Node* n, OpFlags family);

// Whether n maps to an elementwise binary op (Add, Multiply, ...): a post-op when it follows a
// compute op in a partition.
inline bool is_binary_op(const Node* n) { return in_family(n, kBinary); }

// Whether an op of this kind (ignoring the overload) appears in the table.
bool table_has_kind(c10::Symbol kind);

// fp32/bf16, and the quantized dtypes as their int data (quint8 -> u8, qint8 -> s8).
std::optional<dnnl::graph::logical_tensor::data_type> to_dnnl_dtype(c10::ScalarType t);

// The oneDNN data type of a group input: to_dnnl_dtype's, or boolean (a Select's condition).
dnnl::graph::logical_tensor::data_type input_dtype(c10::ScalarType t);

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

bool is_tensor(const Value* v);

}  // namespace llga
