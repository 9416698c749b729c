#pragma once
// Every live fusion kernel by its group id (kernel_registry.cpp), for release_compiled_partitions.
#include <cstdint>
#include <vector>

#include "jit/codegen/onednn/runtime/fusion_kernel.h"

namespace llga {

void register_kernel(int64_t group_id, FusionKernel* kernel);
void unregister_kernel(int64_t group_id, FusionKernel* kernel);
// Drops the compiled partitions of these groups (a speed choice's losing form: runtime/speed_choice.cpp).
void release_groups(const std::vector<int64_t>& group_ids);

}  // namespace llga
