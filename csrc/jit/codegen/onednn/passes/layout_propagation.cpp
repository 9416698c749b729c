// An output read only by other fusion groups may stay in the layout oneDNN picks (often blocked):
// the next group reads it as is and no reorder to strided happens at the boundary. An output that
// PyTorch reads (another op, a graph output) is a normal strided tensor: in eager's strides, except
// a 4-D output of a group with a convolution that only groups and elementwise ops read (their
// other operands scalars or per channel), whose results only groups read. That one is handed over in channels-last strides, the layout oneDNN's
// convolutions compute in on AVX-512 (acdb): MobileNetV3's squeeze-and-excitation scale x * s,
// left to PyTorch (onednn_quirks.h, broadcast_up_post_op), reads x and feeds the next convolution
// with no reorder to NCHW and back. Elementwise ops give the same values for any strides; their
// channels-last results reach groups only, which take any strides (and a guard hands a failed
// group's fallback eager's layout).
#include <torch/csrc/jit/jit_log.h>

#include <unordered_set>

#include "jit/codegen/onednn/mapping/onednn_quirks.h"
#include "jit/codegen/onednn/mapping/op_table.h"
#include "jit/codegen/onednn/passes/passes.h"

namespace llga {

namespace {

// Whether only fusion groups read v's data: aten::size and aten::dim read its sizes, which an LLGA
// tensor has (a transformers layer reads its input's sizes: counted as a reader, Whisper's residual
// stream went to PyTorch's transposed strides and was copied twice a layer).
// Where a speed choice's form returns v (passes/speed_choices.cpp), v's readers are the If's output's.
const Value* through_speed_choice(const torch::jit::Use& use) {
  const Node* ret = use.user;
  if (ret->kind() != c10::prim::Return || !ret->owningBlock()->owningNode()) return nullptr;
  const Node* branch = ret->owningBlock()->owningNode();
  if (branch->kind() != c10::prim::If || branch->input(0)->node()->kind() != kSpeedChoice) return nullptr;
  return branch->output(use.offset);
}

bool read_by_groups_only(const Value* v) {
  bool read_by_a_group = false;
  for (const auto& use : v->uses()) {
    if (const Value* out = through_speed_choice(use)) {
      if (!read_by_groups_only(out)) return false;
      read_by_a_group = true;
      continue;
    }
    // (a speed choice keys its timing by its group's input sizes: it reads no data either)
    if (use.user->kind() == c10::aten::size || use.user->kind() == c10::aten::dim || use.user->kind() == kSpeedChoice) continue;
    if (use.user->kind() != kFusionGroup) return false;
    read_by_a_group = true;
  }
  return read_by_a_group;
}

// Ops whose every output element comes from the same-index elements of their (broadcast) inputs
// (the op table's kStrideAgnostic, any overload): the values do not depend on the strides.
bool elementwise(const Node* n) { return (kind_flags(n->kind()) & kStrideAgnostic) && n->outputs().size() == 1; }

// The op's result is 4-D and its other tensor operands are one value or one per channel
// ([.., C, 1, 1]): its loop follows the channels-last operand, not a mix of layouts.
bool per_channel_operands(const Node* op, const Value* out) {
  auto result = op->output()->type()->cast<torch::jit::TensorType>();
  if (!result || result->dim() != 4) return false;
  for (const Value* v : op->inputs()) {
    if (v == out || !v->type()->cast<torch::jit::TensorType>()) continue;
    auto sizes = v->type()->expect<torch::jit::TensorType>()->sizes().concrete_sizes();
    if (!sizes) return false;
    int64_t numel = 1;
    for (int64_t d : *sizes) numel *= d;
    bool per_channel = sizes->size() == 4 && (*sizes)[2] == 1 && (*sizes)[3] == 1;
    if (numel != 1 && !per_channel) return false;
  }
  return true;
}

// A group of image ops (a 2-D convolution, of a 4-D output, in it): its 4-D outputs are computed channels-last.
bool convolves(const Node* group) {
  for (const Node* n : group->g(c10::attr::Subgraph)->nodes()) {
    if (onednn_kind(n) != op::kind::Convolution) continue;
    auto t = n->output()->type()->cast<torch::jit::TensorType>();
    if (t && t->dim() == 4) return true;
  }
  return false;
}

// Whether a group reading v reads it with a reduction (quirks::reduction_reads_plain).
bool read_by_a_reduction(const Value* v) {
  for (const auto& use : v->uses()) {
    if (use.user->kind() != kFusionGroup) continue;
    for (const auto& u : use.user->g(c10::attr::Subgraph)->inputs()[use.offset]->uses())
      if (in_family(u.user, kReduction)) return true;
  }
  return false;
}

int64_t layout_of(const Node* group, const Value* out) {
  if (quirks::reduction_reads_plain() && read_by_a_reduction(out)) return kStridedOutput;
  if (read_by_groups_only(out)) return kOpaqueOutput;
  auto t = out->type()->cast<torch::jit::TensorType>();
  if (!t || t->dim() != 4 || out->uses().empty() || !convolves(group)) return kStridedOutput;
  for (const auto& use : out->uses())
    if (use.user->kind() != kFusionGroup && !(elementwise(use.user) && per_channel_operands(use.user, out) &&
                                               read_by_groups_only(use.user->output())))
      return kStridedOutput;
  return kChannelsLastOutput;
}

void propagate(torch::jit::Block* block) {
  for (Node* n : block->nodes()) {
    for (auto* b : n->blocks()) propagate(b);
    if (n->kind() != kFusionGroup) continue;
    std::vector<int64_t> layouts;
    for (Value* out : n->outputs()) layouts.push_back(layout_of(n, out));
    n->is_(kOpaqueOutputs, layouts);
  }
}

}  // namespace

void PropagateLayout(std::shared_ptr<Graph>& g) {
  propagate(g->block());
  GRAPH_DUMP("After PropagateLayout", g);
}

}  // namespace llga
