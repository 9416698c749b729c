#include "jit/codegen/onednn/runtime/fusion_kernel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/strides.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <numeric>
#include <unordered_set>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/jit_log.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/graph_builder.h"
#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/runtime/to_dense.h"
#include "onednn/buffer_pool.h"

namespace llga {

using dnnl::graph::logical_tensor;
using torch::jit::Stack;
using torch::jit::TensorType;

namespace {

void* data_of(const at::Tensor& t) {
  return is_llga_tensor(t) ? llga_impl(t).data() : const_cast<void*>(t.const_data_ptr());
}

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
// column-major (quirks::copy_interleaved_matmul_inputs).
bool batch_dims_outside(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  const size_t r = sizes.size();
  if (r <= 2 || !quirks::copy_interleaved_matmul_inputs()) return true;
  c10::SmallVector<size_t, 8> order(r);
  std::iota(order.begin(), order.end(), size_t(0));
  if (dense_in_order(sizes, strides, order)) return true;
  std::swap(order[r - 2], order[r - 1]);
  return dense_in_order(sizes, strides, order);
}

// A tensor oneDNN can read in place: LLGA, or contiguous, or channels-last; any dense layout for
// an input only convolutions and matmuls read in a group without binary ops (a transposed conv1d
// input is "nwc", the layout the convolution wants: copying it cost XML-CNN three reorders),
// except a layout a matmul reads wrongly (batch_dims_outside). Other dense layouts (a transposed
// tensor) are copied where quirks::copy_transposed_inputs() says, and every layout but the
// contiguous one (channels-last too) where plain_only (binary_chain_of_binaries).
at::Tensor readable(const at::Tensor& t, bool any_dense = false, bool read_by_matmul = false, bool plain_only = false) {
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

// An image's planes interleaved: NCHW to NHWC, C (1-4) known at compile time so that the
// interleaving stores vectorize.
template <typename T, int C>
[[gnu::target_clones("avx512f", "avx2", "default"), gnu::optimize("O3")]] void interleave_planes(const T* __restrict in, T* __restrict out,
                                                                                               int64_t plane, int64_t begin, int64_t end) {
  const T* __restrict planes[C];
  for (int c = 0; c < C; ++c) planes[c] = in + c * plane;
  for (int64_t p = begin; p < end; ++p)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[p * C + c] = planes[c][p];
}

template <typename T>
void interleave(const T* in, T* out, int64_t n, int64_t c, int64_t plane) {
  for (int64_t i = 0; i < n; ++i) {
    const T* src = in + i * c * plane;
    T* dst = out + i * c * plane;
    at::parallel_for(0, plane, 16 * 1024, [&](int64_t begin, int64_t end) {
      switch (c) {
        case 1: return interleave_planes<T, 1>(src, dst, plane, begin, end);
        case 2: return interleave_planes<T, 2>(src, dst, plane, begin, end);
        case 3: return interleave_planes<T, 3>(src, dst, plane, begin, end);
        default: return interleave_planes<T, 4>(src, dst, plane, begin, end);
      }
    });
  }
}

// A contiguous NCHW image of 1-4 channels (a model's input) that only convolutions read goes to
// oneDNN channels-last: oneDNN reorders it so inside the partition anyway, and slowly at so few
// channels (60 us for 1x3x224x224 in ONEDNN_VERBOSE). A MobileNetV2-like stem, conv + depthwise
// conv + pool: 133 us a call before, 117 after (AMD EPYC Zen 5, 2 threads). Other tensors (LLGA
// ones too: a group's output is already in the layout oneDNN chose) are returned as they are.
at::Tensor image_to_channels_last(const at::Tensor& t) {
  if (!t.defined() || is_llga_tensor(t) || t.dim() != 4 || t.size(1) > 4 || t.numel() == 0 || !t.is_contiguous() ||
      t.is_contiguous(at::MemoryFormat::ChannelsLast) || (t.scalar_type() != at::kFloat && t.scalar_type() != at::kBFloat16))
    return t;
  // From the buffer pool: the same size comes back on every call (fresh memory: a fault per page).
  const size_t nbytes = t.nbytes();
  void* p = onednn::allocate_buffer(nbytes, 64);
  TORCH_CHECK(p, "torch_llga: out of memory allocating ", nbytes, " bytes");
  at::Tensor out = at::from_blob(p, t.sizes(), c10::get_channels_last_strides_2d(t.sizes()), &onednn::free_buffer, t.options());
  const int64_t plane = t.size(2) * t.size(3);
  if (t.scalar_type() == at::kFloat)
    interleave(static_cast<const uint32_t*>(t.const_data_ptr()), static_cast<uint32_t*>(out.data_ptr()), t.size(0), t.size(1), plane);
  else
    interleave(static_cast<const uint16_t*>(t.const_data_ptr()), static_cast<uint16_t*>(out.data_ptr()), t.size(0), t.size(1), plane);
  return out;
}

// Whether v is read only as a convolution's source (see image_to_channels_last()).
bool read_as_conv_source_only(const Value* v) {
  for (const auto& use : v->uses()) {
    const OpEntry* e = find_entry(use.user);
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

template <typename Key>
void append_key(Key& key, const at::Tensor& t) {
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

// "opaque", "strided [..]" per output: what layout oneDNN chose (logged at compile time only).
std::string describe_layouts(const std::vector<logical_tensor>& lts) {
  std::string s;
  for (const auto& lt : lts) {
    if (!s.empty()) s += ", ";
    s += lt.get_layout_type() == logical_tensor::layout_type::opaque ? "opaque"
                                                                      : "strided " + c10::str(c10::IntArrayRef(lt.get_strides()));
  }
  return s;
}

// Every live kernel by the subgraph it runs, for release_compiled_partitions.
std::mutex g_kernels_mutex;
std::unordered_multimap<int64_t, FusionKernel*> g_kernels;  // by group id

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

// Whether input t (from stack slot arg) may become output lt, computed in its memory: t is an LLGA
// tensor (memory this library allocated: a dense tensor from elsewhere may share its buffer beyond
// what the counts show, as a copy-on-write clone or a file mapping does) in lt's very layout, and
// nothing but this call holds it. The references expected are the call's (`inputs`), the stack
// slot's and, for a guard's output, the interpreter's register for it (see kGuardedInputs); any
// other (a register of a value read later, a forked task, a view of the storage, a weak reference)
// makes it shared.
bool reusable_as_output(const at::Tensor& t, const c10::IValue& arg, bool guarded, const logical_tensor& lt) {
  if (!is_llga_tensor(t) || !arg.isTensor() || arg.unsafeToTensorImpl() != t.unsafeGetTensorImpl()) return false;
  const auto& d = llga_impl(t).desc();
  bool same_layout = d.get_data_type() == lt.get_data_type() && d.get_dims() == lt.get_dims() &&
                     d.get_layout_type() == lt.get_layout_type() &&
                     (lt.get_layout_type() == logical_tensor::layout_type::opaque ? d.get_layout_id() == lt.get_layout_id()
                                                                                 : d.get_strides() == lt.get_strides());
  bool sole = t.use_count() == static_cast<size_t>(2 + guarded) && t.weak_use_count() == 1 && t.storage().use_count() == 1;
  // Writes below must follow the release of the other references (a forked task's, say).
  std::atomic_thread_fence(std::memory_order_acquire);
  return same_layout && sole;
}

}  // namespace

FusionKernel::Compiled::Compiled() { runtime::stats().cached_partitions.fetch_add(1, std::memory_order_relaxed); }
FusionKernel::Compiled::~Compiled() { runtime::stats().cached_partitions.fetch_sub(1, std::memory_order_relaxed); }

FusionKernel::FusionKernel(const torch::jit::Node* node)
    : subgraph_(node->g(c10::attr::Subgraph)), num_inputs_(node->inputs().size()) {
  {
    std::lock_guard<std::mutex> lock(g_kernels_mutex);
    group_id_ = node->hasAttribute(kGroupId) ? node->i(kGroupId) : -1;
    g_kernels.emplace(group_id_, this);
  }
  // What torch.profiler shows for this group: "llga::FusionGroup[_convolution+relu]".
  profiler_name_ = "llga::FusionGroup[";
  for (const Node* n : subgraph_->nodes())
    if (n->kind() != c10::prim::Constant)
      profiler_name_ += std::string(profiler_name_.back() == '[' ? "" : "+") + n->kind().toUnqualString();
  profiler_name_ += "]";
  whole_fallback_ = !bind(node);
}

bool FusionKernel::bind(const torch::jit::Node* node) {
  ports_ = group_partition(node);
  if (!ports_) return false;
  const GroupPartition& gp = *ports_;
  profiled_.partition = gp.partition;

  auto guarded = node->hasAttribute(kGuardedInputs) ? node->is(kGuardedInputs) : std::vector<int64_t>{};
  auto nodes = subgraph_->nodes();
  bool binary_free = std::none_of(nodes.begin(), nodes.end(), [](const Node* n) { return is_binary_op(n); });
  bool binary_chain = binary_chain_of_binaries(*subgraph_);
  // quirks::copy_matmul_post_op_operands: a matmul's post-op operand goes to oneDNN contiguous.
  bool matmul_post_ops = quirks::copy_matmul_post_op_operands() && !binary_free &&
                         std::any_of(nodes.begin(), nodes.end(), [](const Node* n) {
                           const OpEntry* e = find_entry(n);
                           return e && e->kind == dnnl::graph::op::kind::MatMul;
                         });
  inputs_.resize(num_inputs_);
  for (size_t i = 0; i < num_inputs_; ++i) {
    const Value* v = subgraph_->inputs()[i];
    inputs_[i].guarded = i < guarded.size() && guarded[i];
    inputs_[i].any_dense = binary_free && read_by_conv_or_matmul_only(v);
    inputs_[i].read_by_matmul = read_by_matmul(v);
    inputs_[i].image = read_as_conv_source_only(v);
    inputs_[i].plain_only = binary_chain || (matmul_post_ops && std::any_of(v->uses().begin(), v->uses().end(), [](const auto& u) {
                                               return is_binary_op(u.user);
                                             }));
  }

  auto in_lts = profiled_.partition.get_input_ports();
  for (size_t p = 0; p < in_lts.size(); ++p) {
    int64_t i = gp.input[p];
    InPort port;
    if (i >= 0) {
      port.input = static_cast<size_t>(i);
      port.sizes = *subgraph_->inputs()[i]->type()->expect<TensorType>()->sizes().concrete_sizes();
      inputs_[i].ports++;
    } else if (gp.constant[p].defined()) {
      port.constant = readable(gp.constant[p]);
      port.sizes = in_lts[p].get_dims();
    } else {
      return false;  // neither a group input nor a weight
    }
    in_ports_.push_back(std::move(port));
    profiled_.in_ids.push_back(in_lts[p].get_id());
  }

  auto opaque = node->hasAttribute(kOpaqueOutputs) ? node->is(kOpaqueOutputs) : std::vector<int64_t>{};
  output_port_.assign(subgraph_->outputs().size(), SIZE_MAX);
  auto out_lts = profiled_.partition.get_output_ports();
  for (size_t p = 0; p < out_lts.size(); ++p) {
    int64_t j = gp.output[p];
    if (j < 0) return false;  // an output no group output is
    OutPort port;
    auto t = subgraph_->outputs()[j]->type()->expect<TensorType>();
    port.dtype = *t->scalarType();
    port.sizes = *t->sizes().concrete_sizes();
    // Outputs PyTorch reads get the profiled strides (eager's memory format) when dense, else contiguous;
    // channels-last ones where only groups and elementwise ops read them (kChannelsLastOutput).
    auto strides = *t->strides().concrete_sizes();
    if (!at::empty_strided(port.sizes, strides, at::TensorOptions().device(at::kMeta)).is_non_overlapping_and_dense()) {
      auto contiguous = c10::contiguous_strides(port.sizes);
      strides.assign(contiguous.begin(), contiguous.end());
    }
    if (c10::isQIntType(port.dtype)) {
      port.qparams = quantize_params(subgraph_->outputs()[j]->node());
      if (!port.qparams) return false;
      strides = quantized_strides(port.sizes);
    }
    const int64_t layout = static_cast<size_t>(j) < opaque.size() ? opaque[j] : kStridedOutput;
    if (layout == kChannelsLastOutput && port.sizes.size() == 4 && !port.qparams) {
      auto channels_last = c10::get_channels_last_strides_2d(port.sizes);
      strides.assign(channels_last.begin(), channels_last.end());
    }
    port.opaque = layout == kOpaqueOutput && !port.qparams;
    port.strides = unit_dims_dense(port.sizes, strides);
    output_port_[j] = out_ports_.size();
    out_ports_.push_back(std::move(port));
    profiled_.out_ids.push_back(out_lts[p].get_id());
  }
  return std::find(output_port_.begin(), output_port_.end(), SIZE_MAX) == output_port_.end();  // every output a port
}

FusionKernel::~FusionKernel() {
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  auto [first, last] = g_kernels.equal_range(group_id_);
  for (auto it = first; it != last; ++it)
    if (it->second == this) {
      g_kernels.erase(it);
      break;
    }
}

void FusionKernel::release() {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cache_.clear();  // a call executing one now holds its own reference
}

// Called under cache_mutex_. The fuser partitioned the block for the profiled sizes; a partition
// for any sizes of the same ranks is asked of oneDNN only once some call brings other sizes.
const FusionKernel::Partition* FusionKernel::any_sizes() {
  if (!any_sizes_made_) {
    any_sizes_made_ = true;
    auto gp = subgraph_partition(*subgraph_, /*ranks_only=*/true);
    if (gp && same_ports(*gp, *ports_)) {
      any_sizes_ = std::make_unique<Partition>();
      any_sizes_->partition = gp->partition;
      for (const auto& lt : gp->partition.get_input_ports()) any_sizes_->in_ids.push_back(lt.get_id());
      for (const auto& lt : gp->partition.get_output_ports()) any_sizes_->out_ids.push_back(lt.get_id());
    }
  }
  return any_sizes_.get();
}

// Whether every op of the group maps to oneDNN at the sizes of these arguments as it did at the
// profiled ones. The op table keeps some ops from oneDNN at some sizes only (onednn_quirks.h: a
// broadcast oneDNN computes wrongly), and the partition for any sizes of the profiled ranks would
// otherwise run them at sizes the fuser never saw. The group's ops run once, unfused, to learn the
// sizes of every value; the op table then judges each op at them. Once per new input sizes.
bool FusionKernel::maps_at(c10::ArrayRef<c10::IValue> args) {
  auto g = subgraph_->copy();
  std::vector<Value*> made;
  for (Node* n : g->nodes())
    for (Value* v : n->outputs())
      if (v->type()->cast<torch::jit::TensorType>()) made.push_back(v);
  const size_t first = g->outputs().size();
  for (Value* v : made) g->registerOutput(v);
  Stack stack;
  for (const c10::IValue& a : args) stack.push_back(a.isTensor() ? c10::IValue(llga_to_dense(a.toTensor())) : a);
  for (size_t i = 0; i < args.size(); ++i)
    if (stack[i].isTensor()) g->inputs()[i]->setType(torch::jit::TensorType::create(stack[i].toTensor()));
  try {
    torch::jit::Code code(g, "llga_sizes");
    torch::jit::InterpreterState(code).run(stack);
  } catch (const std::exception& e) {  // the caller's fallback run raises it where eager would
    GRAPH_DEBUG("The group's ops failed on these inputs (", e.what(), ")");
    return false;
  }
  for (size_t k = 0; k < made.size(); ++k)
    if (stack[first + k].isTensor()) made[k]->setType(torch::jit::TensorType::create(stack[first + k].toTensor()));
  std::unordered_set<const Node*> members;
  for (const Node* n : g->nodes()) members.insert(n);
  for (const Node* n : g->nodes()) {
    if (is_binary_op(n) && quirks::wrong_in_partition(n, members)) {
      GRAPH_DEBUG("At these input sizes oneDNN computes ", n->kind().toQualString(), " wrongly as a post-op: the group runs unfused for them");
      return false;
    }
    if (!find_entry(n) || map_node(n)) continue;
    GRAPH_DEBUG("At these input sizes ", n->kind().toQualString(), " stays out of oneDNN (", unmapped_reason(n),
                "): the group runs unfused for them");
    return false;
  }
  return true;
}

void FusionKernel::compile(Compiled& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args) {
  // For the profiled sizes the outputs' sizes (and eager's strides) are known; for other sizes
  // oneDNN infers them, and outputs PyTorch reads come back contiguous.
  bool profiled_sizes = true;
  for (const InPort& port : in_ports_) {
    const at::Tensor& t = port.input == kConstantPort ? port.constant : inputs[port.input];
    auto sizes = is_llga_tensor(t) ? llga_impl(t).desc().get_dims() : t.dim() == 0 ? std::vector<int64_t>{1} : t.sizes().vec();
    profiled_sizes = profiled_sizes && sizes == port.sizes;
  }
  const Partition* part = profiled_sizes ? &profiled_ : maps_at(args) ? any_sizes() : nullptr;
  if (!part) {
    GRAPH_DEBUG("No partition of the group compiles for other sizes; running it unfused:\n", *subgraph_);
    c.fallback = true;
    return;
  }
  const auto& in_ids = part->in_ids;
  const auto& out_ids = part->out_ids;
  for (size_t p = 0; p < in_ports_.size(); ++p) {
    bool constant = in_ports_[p].input == kConstantPort;
    const at::Tensor& t = constant ? in_ports_[p].constant : inputs[in_ports_[p].input];
    auto prop = constant ? logical_tensor::property_type::constant : logical_tensor::property_type::variable;
    if (is_llga_tensor(t)) {
      const auto& d = llga_impl(t).desc();
      c.inputs.push_back(d.get_layout_type() == logical_tensor::layout_type::opaque
                             ? logical_tensor(in_ids[p], d.get_data_type(), d.get_dims(), d.get_layout_id(), prop)
                             : logical_tensor(in_ids[p], d.get_data_type(), d.get_dims(),
                                              unit_dims_dense(d.get_dims(), d.get_strides()), prop));
    } else {
      bool scalar = t.dim() == 0;  // a 0-dim constant: [1] to oneDNN
      c.inputs.emplace_back(in_ids[p], input_dtype(t.scalar_type()), scalar ? std::vector<int64_t>{1} : t.sizes().vec(),
                            scalar ? std::vector<int64_t>{1} : unit_dims_dense(t.sizes(), t.strides()), prop);
    }
  }
  std::vector<logical_tensor> outputs;
  for (size_t p = 0; p < out_ports_.size(); ++p) {
    const OutPort& port = out_ports_[p];
    auto dtype = *to_dnnl_dtype(port.dtype);
    auto sizes = profiled_sizes ? port.sizes : std::vector<int64_t>(port.sizes.size(), DNNL_GRAPH_UNKNOWN_DIM);
    outputs.push_back(port.opaque      ? logical_tensor(out_ids[p], dtype, sizes, logical_tensor::layout_type::any)
                      : profiled_sizes ? logical_tensor(out_ids[p], dtype, sizes, port.strides)
                                       : logical_tensor(out_ids[p], dtype, sizes, logical_tensor::layout_type::strided));
  }
  try {
    runtime::stats().compilations.fetch_add(1, std::memory_order_relaxed);
    try {
      c.partition = part->partition.compile(c.inputs, outputs, runtime::engine());
    } catch (const dnnl::error& e) {
      // Some partitions take no "any" output layout (oneDNN 3.12: a lone Reorder): those outputs
      // are asked for strided, and still travel as LLGA tensors.
      bool retried = false;
      for (size_t p = 0; p < outputs.size(); ++p) {
        if (outputs[p].get_layout_type() != logical_tensor::layout_type::any) continue;
        outputs[p] = logical_tensor(out_ids[p], outputs[p].get_data_type(), outputs[p].get_dims(),
                                    logical_tensor::layout_type::strided);
        retried = true;
      }
      if (!retried) throw;
      GRAPH_DEBUG("oneDNN could not compile the partition for opaque outputs (", e.what(), "); asking for strided ones");
      c.partition = part->partition.compile(c.inputs, outputs, runtime::engine());
    }
    for (size_t p = 0; p < out_ids.size(); ++p) {
      c.outputs.push_back(c.partition.query_logical_tensor(out_ids[p]));
      c.out_sizes.push_back(c.outputs[p].get_dims());
      c.out_strides.push_back(c.outputs[p].get_layout_type() == logical_tensor::layout_type::strided
                                  ? c.outputs[p].get_strides() : std::vector<int64_t>{});
      c.out_formats.push_back(out_ports_[p].qparams ? memory_format_of(c.out_sizes[p], c.out_strides[p])
                                                    : c10::MemoryFormat::Contiguous);
    }
    for (const auto& [in_id, out_id] : c.partition.get_inplace_ports()) {
      auto in = std::find(in_ids.begin(), in_ids.end(), in_id);
      auto out = std::find(out_ids.begin(), out_ids.end(), out_id);
      if (in == in_ids.end() || out == out_ids.end()) continue;
      size_t p_in = in - in_ids.begin(), p_out = out - out_ids.begin();
      // Only an input no other port of the group reads (conv(x) + x must not overwrite x early).
      size_t i = in_ports_[p_in].input;
      if (i == kConstantPort || inputs_[i].ports != 1 || out_ports_[p_out].qparams) continue;
      c.inplace.emplace_back(p_in, p_out);
    }
    for (const auto& lt : c.inputs) c.in_tensors.emplace_back(lt, runtime::engine(), nullptr);
    for (const auto& lt : c.outputs) c.out_tensors.emplace_back(lt, runtime::engine(), nullptr);
    c.in_handles.assign(c.in_tensors.size(), nullptr);
    c.out_handles.assign(c.out_tensors.size(), nullptr);
    GRAPH_DEBUG("Compiled a partition of ", part->partition.get_ops_num(), " ops for ", c.inputs.size(), " inputs; outputs: ",
                describe_layouts(c.outputs));
  } catch (const std::exception& e) {  // dnnl::error, or a C++ exception oneDNN let through its C API
    GRAPH_DEBUG("oneDNN could not compile the partition (", e.what(), "); running it unfused:\n", *subgraph_);
    c.fallback = true;
  }
}

std::shared_ptr<FusionKernel::Compiled> FusionKernel::compiled_for(const Inputs& inputs, c10::ArrayRef<c10::IValue> args) {
  Key key;
  for (const InPort& port : in_ports_)
    if (port.input != kConstantPort) append_key(key, inputs[port.input]);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (std::equal(key.begin(), key.end(), (*it)->key.begin(), (*it)->key.end())) {
      if (it != cache_.begin()) cache_.splice(cache_.begin(), cache_, it);
      return cache_.front();
    }
  }
  while (!cache_.empty() && static_cast<int64_t>(cache_.size()) >= std::max<int64_t>(runtime::cache_capacity(), 1)) {
    cache_.pop_back();
    runtime::stats().evictions.fetch_add(1, std::memory_order_relaxed);
  }
  auto c = std::make_shared<Compiled>();
  c->key.assign(key.begin(), key.end());
  compile(*c, inputs, args);
  cache_.push_front(c);
  return c;
}

torch::jit::Code& FusionKernel::fallback_code() {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (!fallback_code_) fallback_code_ = std::make_unique<torch::jit::Code>(subgraph_->copy(), "llga_fallback");
  return *fallback_code_;
}

void FusionKernel::run_fallback(Stack& stack) {
  runtime::stats().kernel_fallbacks.fetch_add(1, std::memory_order_relaxed);
  torch::jit::Code& code = fallback_code();
  for_pytorch(stack);
  torch::jit::InterpreterState(code).run(stack);
}

// The group's inputs (the stack's last num_inputs_) as PyTorch's ops take them: tensors densified,
// in eager's layout (in_profiled_layout); other inputs as they were.
void FusionKernel::for_pytorch(Stack& stack) const {
  for (size_t i = 0; i < num_inputs_; ++i) {
    auto& slot = stack[stack.size() - num_inputs_ + i];
    if (!slot.isTensor()) continue;
    at::Tensor t = llga_to_dense(slot.toTensor());
    auto profiled = subgraph_->inputs()[i]->type()->cast<TensorType>();
    slot = profiled ? in_profiled_layout(t, *profiled) : t;
  }
}

// CPU time of the calling thread, in ns (not the time it waited for others or for a core).
static double thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

// oneDNN runs some partitions with a reference kernel, 7-3700x slower than PyTorch runs the same
// ops (onednn_quirks.h keeps the known ones out of partitions; 567 ms against 0.28 ms for a
// [1, 12, 128, 768] x [1, 12, 768, 64] matmul with a per-head bias). So a compiled partition's
// second and third executions each also run the group's ops unfused, first (an in-place output
// may overwrite an input), on the same inputs, and time both. Slower than kSlowFactor times the
// unfused ops plus kSlowMarginNs both times, the partition runs unfused from then on (the
// unfused ops' first run is their slowest: the check errs towards keeping the partition). The
// margin is tens of milliseconds, and both the wall time and the calling thread's CPU time must
// exceed it: with other processes on the cores an OpenMP region waits for a thread the OS has
// descheduled (libgomp spinning meanwhile), and tiny partitions took 7-11 ms against 3-12 us
// unfused, twice in a row (fuzzing beside two busy processes). So the check catches the costly
// traps (the reference kernels swept cost 20-1200 ms more than PyTorch's ops at realistic sizes);
// cheaper ones are the quirks' to keep out.
void FusionKernel::run_checking_speed(Compiled& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, Stack& stack) {
  constexpr double kSlowFactor = 5;
  constexpr double kSlowMarginNs = 25e6;
  std::unique_lock<std::mutex> lock(c.check_mutex);
  int left = c.checks_left.load(std::memory_order_relaxed);
  if (left == kSpeedChecks + 1 || left == 0) {  // the warm-up execution (or another thread's check ended)
    if (left > 0) c.checks_left.store(left - 1, std::memory_order_relaxed);
    lock.unlock();
    return execute(c, inputs, args, stack);
  }
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  double start_cpu = thread_cpu_ns();
  try {
    Stack unfused(args.begin(), args.end());
    for_pytorch(unfused);
    torch::jit::InterpreterState(fallback_code()).run(unfused);
  } catch (const std::exception& e) {  // no verdict: the fused call goes on as it would have
    GRAPH_DEBUG("The speed check's unfused run failed (", e.what(), ")");
    c.checks_left.store(0, std::memory_order_relaxed);
    lock.unlock();
    return execute(c, inputs, args, stack);
  }
  auto middle = Clock::now();
  double middle_cpu = thread_cpu_ns();
  execute(c, inputs, args, stack);
  auto end = Clock::now();
  double end_cpu = thread_cpu_ns();
  double unfused_ns = std::chrono::duration<double, std::nano>(middle - start).count();
  double fused_ns = std::chrono::duration<double, std::nano>(end - middle).count();
  auto slow = [&](double fused, double unfused) { return fused > kSlowFactor * unfused + kSlowMarginNs; };
  c.slow_verdicts += slow(fused_ns, unfused_ns) && slow(end_cpu - middle_cpu, middle_cpu - start_cpu);
  c.checks_left.store(left - 1, std::memory_order_relaxed);
  if (left - 1 == 0 && c.slow_verdicts == kSpeedChecks) {
    c.fallback = true;
    runtime::stats().slow_partitions.fetch_add(1, std::memory_order_relaxed);
    TORCH_WARN("torch_llga: oneDNN ran a fused group (", profiler_name_, ") ",
               static_cast<int64_t>(fused_ns / std::max(unfused_ns, 1.0)), "x slower than PyTorch runs its ops (",
               static_cast<int64_t>(fused_ns / 1e3), " against ", static_cast<int64_t>(unfused_ns / 1e3),
               " us): it runs unfused for these inputs. Please report the model (torch_llga.explain shows the group).");
  }
}

// The per-call path: no graph work, no strings; the cache lookup compares a key built on the stack,
// oneDNN's tensor objects are reused, and the only allocations are the outputs' memory.
void FusionKernel::run(Stack& stack) {
  RECORD_FUNCTION(profiler_name_, c10::ArrayRef<const c10::IValue>{});  // a flag test unless profiling
  if (whole_fallback_) return run_fallback(stack);
  Inputs inputs;
  auto args = torch::jit::last(stack, num_inputs_);
  for (size_t i = 0; i < num_inputs_; ++i) {
    inputs.push_back(args[i].isTensor() ? readable(args[i].toTensor(), inputs_[i].any_dense, inputs_[i].read_by_matmul,
                                                   inputs_[i].plain_only)
                                        : at::Tensor());
    if (inputs_[i].image) inputs.back() = image_to_channels_last(inputs.back());
  }
  std::shared_ptr<Compiled> compiled = compiled_for(inputs, args);
  Compiled& c = *compiled;
  if (c.fallback.load(std::memory_order_relaxed)) return run_fallback(stack);
  if (c.checks_left.load(std::memory_order_relaxed) > 0) return run_checking_speed(c, inputs, args, stack);
  execute(c, inputs, args, stack);
}

void FusionKernel::execute(Compiled& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, Stack& stack) {
  c10::SmallVector<at::Tensor, 4> outs(c.outputs.size());
  for (auto [p_in, p_out] : c.inplace) {
    size_t i = in_ports_[p_in].input;
    if (!out_ports_[p_out].opaque || !reusable_as_output(inputs[i], args[i], inputs_[i].guarded, c.outputs[p_out])) continue;
    outs[p_out] = inputs[i];
    runtime::stats().inplace_outputs.fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t p = 0; p < c.outputs.size(); ++p) {
    if (outs[p].defined()) continue;  // computed in place
    const auto& lt = c.outputs[p];
    // An output only groups read is an LLGA tensor whatever layout oneDNN chose (blocked, or a
    // strided one such as NHWC): the next group reads its layout from it, and guards accept it.
    const OutPort& port = out_ports_[p];
    const auto& q = port.qparams;
    outs[p] = port.opaque ? empty_llga(lt, port.dtype)
              : q ? at::_empty_affine_quantized(c.out_sizes[p], at::TensorOptions().dtype(port.dtype), q->scale,
                                                q->zero_point, c.out_formats[p])
                  : at::empty_strided(c.out_sizes[p], c.out_strides[p], at::TensorOptions().dtype(port.dtype));
  }
  {
    std::lock_guard<std::mutex> lock(c.execute_mutex);
    // oneDNN's set_data_handle allocates (a new memory object per call): only changed pointers are
    // set. Weights never change, and the buffer pool hands the same buffers back call after call.
    for (size_t p = 0; p < c.in_tensors.size(); ++p) {
      const InPort& port = in_ports_[p];
      void* handle = data_of(port.input == kConstantPort ? port.constant : inputs[port.input]);
      if (handle != c.in_handles[p]) c.in_tensors[p].set_data_handle(c.in_handles[p] = handle);
    }
    for (size_t p = 0; p < c.out_tensors.size(); ++p) {
      void* handle = data_of(outs[p]);
      if (handle != c.out_handles[p]) c.out_tensors[p].set_data_handle(c.out_handles[p] = handle);
    }
    c.partition.execute(runtime::stream(), c.in_tensors, c.out_tensors);
  }
  runtime::stats().executions.fetch_add(1, std::memory_order_relaxed);
  torch::jit::drop(stack, num_inputs_);
  for (size_t j = 0; j < output_port_.size(); ++j) stack.emplace_back(outs[output_port_[j]]);
}

namespace {

void collect_group_ids(const torch::jit::Block* b, std::unordered_set<int64_t>& out) {
  for (const Node* n : b->nodes()) {
    for (const auto* inner : n->blocks()) collect_group_ids(inner, out);
    if (n->kind() == kFusionGroup && n->hasAttribute(kGroupId)) out.insert(n->i(kGroupId));
    auto fn = n->kind() == c10::prim::Constant ? n->output()->type()->cast<c10::FunctionType>() : nullptr;
    if (fn) {  // a guard's fallback: the executor may have optimized (and fused) it on its own
      auto& executor = torch::jit::toGraphFunction(*fn->function()).get_executor();
      if (executor.isOptimized()) {
        auto state = executor.getDebugState();
        for (const auto& [spec, plan] : state.execution_plans) collect_group_ids(plan.graph->block(), out);
      }
    }
  }
}

}  // namespace

int64_t release_compiled_partitions(const torch::jit::Graph* g) {
  std::unordered_set<int64_t> ids;
  if (g) collect_group_ids(g->block(), ids);
  int64_t before = runtime::stats().cached_partitions.load();
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  for (auto& [id, kernel] : g_kernels)
    if (!g || ids.count(id)) kernel->release();
  return before - runtime::stats().cached_partitions.load();
}

namespace {

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        kFusionGroup,
        [](const torch::jit::Node* node) -> torch::jit::Operation {
          auto kernel = std::make_shared<FusionKernel>(node);
          return [kernel](Stack& stack) { kernel->run(stack); };
        },
        c10::AliasAnalysisKind::PURE_FUNCTION),
});

}  // namespace

}  // namespace llga
