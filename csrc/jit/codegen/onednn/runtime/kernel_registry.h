#pragma once
// Every live fusion kernel by its group id (kernel_registry.cpp), for release_compiled_partitions.
#include <cstdint>
#include <unordered_set>

#include "jit/codegen/onednn/runtime/fusion_kernel.h"

namespace llga {

void register_kernel(int64_t group_id, FusionKernel* kernel);
void unregister_kernel(int64_t group_id, FusionKernel* kernel);
// The ids of the groups in b (its blocks too, and the optimized graphs of its fallback functions).
void collect_group_ids(const torch::jit::Block* b, std::unordered_set<int64_t>& out);
// Drops the compiled partitions of these groups (a speed choice's losing form: runtime/speed_choice.cpp).
void release_groups(const std::unordered_set<int64_t>& group_ids);

}  // namespace llga
