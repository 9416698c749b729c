// The guards' run-time side (the pass that inserts them is guard_shapes.cpp): the llga::Guard
// operator, which checks a group's inputs against what it was built for, and llga::AllFinite, the
// NaN/Inf scan several guards share.
#include <torch/csrc/jit/ir/ir.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <atomic>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/kernels/finite_scan.h"
#include "jit/codegen/onednn/mapping/dtypes.h"
#include "jit/codegen/onednn/mapping/llga_nodes.h"
#include "jit/codegen/onednn/runtime/profiled_layout.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/runtime/to_dense.h"

namespace llga {

using torch::jit::Stack;
using torch::jit::TensorType;

namespace {

// The llga::Guard operator (see guard_shapes.cpp): true when every input still has what the
// group was specialized on: dtype, device and sizes (and no grad is needed). Strides are not part of
// that: the kernel compiles for the actual strides (or LLGA layout) and caches per stride pattern,
// so a channels_last or sliced input runs fused and correct. (The profile's strides are also lossy:
// it canonicalizes strides around size-1 dims, so comparing against them rejects valid inputs.)
// Under the "compile" shape policy a shape-free group takes any non-empty sizes of the profiled rank.
// Strided memory that holds the tensor's values: not an efficient zero tensor, a sparse or mkldnn
// tensor (no such memory to hand oneDNN), nor a negated or conjugated view (memory that means
// something else). PyTorch's ops know these; groups get the others.
bool plain_memory(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t._is_zerotensor() && !t.is_neg() && !t.is_conj();
}

// The profile saw this input in NCHW strides (channel stride above 1), not channels-last ones.
bool profiled_nchw(const TensorType& expected) {
  auto strides = expected.strides().concrete_sizes();
  auto sizes = expected.sizes().concrete_sizes();
  return strides && sizes && strides->size() == 4 && ((*sizes)[1] == 1 || (*strides)[1] != 1);
}

// What a guard checks of one input, read from its profiled type once (not per call: the type's
// sizes are optionals, copied out on each read).
struct Expected {
  std::optional<c10::ScalarType> dtype;
  std::optional<c10::Device> device;
  int64_t dim = -1;
  std::optional<std::vector<int64_t>> sizes;  // none: unknown, no tensor matches
  torch::jit::TensorTypePtr type;  // for in_profiled_layout on a mismatch
};

Expected expected_of(const torch::jit::TensorTypePtr& type) {
  Expected e;
  e.dtype = type->scalarType();
  e.device = type->device();
  e.dim = type->dim() ? static_cast<int64_t>(*type->dim()) : -1;
  e.sizes = type->sizes().concrete_sizes();
  e.type = type;
  return e;
}

// "[2, 3] Float strided [3, 1]" (an LLGA tensor: its dense sizes), for the guard's log.
std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  if (is_llga_tensor(t)) return c10::str(t.sizes(), " ", t.scalar_type(), " in oneDNN's layout");
  return c10::str(t.sizes(), " ", t.scalar_type(), " strides ", t.strides(), t.requires_grad() ? " requiring grad" : "");
}

// sizes: kAnySizes (any of the expected rank), else exact.
bool matches(const at::Tensor& t, const Expected& expected, int64_t sizes, bool plain) {
  if (!t.defined() || t.scalar_type() != expected.dtype || t.device() != expected.device) return false;
  if (plain && (is_llga_tensor(t) || !t.has_storage())) return false;  // a plan reads the memory itself
  if (!is_llga_tensor(t) && !plain_memory(t)) return false;
  if (at::GradMode::is_enabled() && t.requires_grad()) return false;
  if (sizes == kAnySizes) return t.dim() == expected.dim && t.numel() > 0;
  return expected.sizes && t.sizes() == c10::IntArrayRef(*expected.sizes);
}

// Rows of a tensor whose last dim is contiguous (a chunk or slice of a wider one: GEGLU's and
// SwiGLU's halves, merged projections' parts), each scanned as above: the outer dims walked with
// their own strides. PyTorch's isfinite().all() took 25 us for a 1x1024x256 half of a linear's output.
template <typename Bits>
bool any_nonfinite_rows(const at::Tensor& t) {
  const int64_t row = t.size(-1), rows = t.numel() / row, outer_dims = t.dim() - 1;
  const Bits* base = static_cast<const Bits*>(t.const_data_ptr());
  auto row_start = [&](int64_t r) {
    int64_t offset = 0;
    for (int64_t d = outer_dims - 1; d >= 0; --d) {
      offset += (r % t.size(d)) * t.stride(d);
      r /= t.size(d);
    }
    return base + offset;
  };
  std::atomic<bool> found{false};
  at::parallel_for(0, rows, std::max<int64_t>(1, 64 * 1024 / row), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end && !found.load(std::memory_order_relaxed); ++r)
      if (any_nonfinite(row_start(r), row)) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

// An LLGA tensor's memory in its oneDNN layout: a blocked one pads with zeros, which are finite.
bool llga_all_finite(const at::Tensor& t) {
  using dt = dnnl::graph::logical_tensor::data_type;
  const auto& d = llga_impl(t).desc();
  const void* data = llga_impl(t).data();
  if (d.get_data_type() == dt::f32) return !any_nonfinite_parallel(static_cast<const uint32_t*>(data), d.get_mem_size() / 4);
  if (d.get_data_type() == dt::bf16) return !any_nonfinite_parallel(static_cast<const uint16_t*>(data), d.get_mem_size() / 2);
  return at::isfinite(llga_to_dense(t)).all().item<bool>();
}

// No NaN or Inf in t, for groups with an op that would turn them into numbers (kFiniteInputs).
// An LLGA tensor is scanned only when asked (llga_too: kScanLlgaToo); otherwise it came from a
// group whose own inputs passed this check. Dense tensors are scanned in memory order (the order
// does not matter for "any").
bool all_finite(const at::Tensor& t, bool llga_too = false) {
  if (!at::isFloatingType(t.scalar_type())) return true;  // quantized/int: no NaN
  if (is_llga_tensor(t)) return !llga_too || llga_all_finite(t);
  const DtypeTraits* dtype = dtype_traits(t.scalar_type());
  if (dtype && (dtype->exponent_mask == 0x7f800000u || dtype->exponent_mask == 0x7f80u)) {  // fp32, bf16
    bool fp32 = dtype->exponent_mask == 0x7f800000u;
    if (t.is_non_overlapping_and_dense())  // the scan's two bit layouts (any_nonfinite_in)
      return fp32 ? !any_nonfinite_parallel(static_cast<const uint32_t*>(t.const_data_ptr()), t.numel())
                  : !any_nonfinite_parallel(static_cast<const uint16_t*>(t.const_data_ptr()), t.numel());
    if (t.dim() >= 2 && t.stride(-1) == 1 && t.numel() > 0)
      return fp32 ? !any_nonfinite_rows<uint32_t>(t) : !any_nonfinite_rows<uint16_t>(t);
  }
  return at::isfinite(t).all().item<bool>();
}

torch::jit::Operation make_guard(const torch::jit::Node* node) {
  std::vector<Expected> expected;
  for (const auto& type : node->tys(c10::attr::types)) expected.push_back(expected_of(type->expect<TensorType>()));
  int64_t shape_free = node->hasAttribute(kShapeFree) ? node->i(kShapeFree) : 0;
  bool finite_inputs = !node->hasAttribute(kFiniteInputs) || node->i(kFiniteInputs);
  bool plain = node->hasAttribute(kPlainInputs) && node->i(kPlainInputs);
  // Per checked input: -1 = scan it here, k = its finiteness is extra input k (an llga::AllFinite).
  auto given = node->hasAttribute(kFiniteGiven) ? node->is(kFiniteGiven) : std::vector<int64_t>(expected.size(), -1);
  size_t extra = node->inputs().size() - expected.size();
  return [expected, shape_free, finite_inputs, plain, given, extra](Stack& stack) {
    size_t n = expected.size();
    auto inputs = torch::jit::last(stack, n + extra);
    int64_t sizes = runtime::shape_policy() == runtime::ShapePolicy::kCompile ? shape_free : 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      ok = matches(inputs[i].toTensor(), expected[i], sizes, plain);
      if (!ok)  // which input, for PYTORCH_JIT_LOG_LEVEL=">>guard_runtime"
        GRAPH_DEBUG("Guard: input ", i, " (", describe(inputs[i].toTensor()), ") is not the profiled ", *expected[i].type,
                    sizes == kAnySizes ? " (any sizes of its rank)" : "", ": the group's ops run unfused");
    }
    if (ok && finite_inputs) {
      for (size_t i = 0; i < n && ok; ++i)
        ok = given[i] == kNotScanned ||
             (given[i] < 0 ? all_finite(inputs[i].toTensor(), given[i] == kScanLlgaToo) : inputs[n + given[i]].toBool());
      if (!ok) runtime::stats().nonfinite_fallbacks.fetch_add(1, std::memory_order_relaxed);
    }
    torch::jit::drop(stack, extra);
    if (!ok) {
      // A plan's fallback is the graph the executor profiles again for these inputs and fuses by
      // groups of any sizes (no small plan then: the profile's sizes vary): a miss, not a fallback
      // to unfused ops (an MLP profiled at batch 1 ran at batch 8 as fast as one profiled there).
      (plain ? runtime::stats().plan_misses : runtime::stats().guard_failures).fetch_add(1, std::memory_order_relaxed);
      // The fallback runs PyTorch ops: no LLGA tensor may reach them, nor a channels-last one
      // where eager's is NCHW (in_profiled_layout).
      for (size_t i = 0; i < n; ++i)
        stack[stack.size() - n + i] = in_profiled_layout(llga_to_dense(stack[stack.size() - n + i].toTensor()), *expected[i].type);
    }
    stack.emplace_back(ok);
  };
}

torch::jit::RegisterOperators registered({
    torch::jit::Operator(kGuard, make_guard, c10::AliasAnalysisKind::CONSERVATIVE),
    // The guards' shared NaN/Inf scan (see guard_shapes.cpp).
    torch::jit::Operator(
        "llga::AllFinite(Tensor x, bool llga_too=False) -> bool",
        [](Stack& stack) {
          // It runs before the guards' other checks: only a tensor they can accept is scanned (an
          // answer for another one is never read: its guard fails first).
          bool llga_too = torch::jit::pop(stack).toBool();
          const at::Tensor t = stack.back().toTensor();
          bool scannable = t.defined() && t.device().is_cpu() && plain_memory(t) && t.has_storage();
          stack.back() = !scannable || all_finite(t, llga_too);
        },
        c10::AliasAnalysisKind::FROM_SCHEMA),
});

}  // namespace

at::Tensor in_profiled_layout(const at::Tensor& t, const TensorType& profiled) {
  if (t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast) && profiled_nchw(profiled))
    return t.contiguous();
  return t;
}

}  // namespace llga
