// Every live fusion kernel by its group id, so torch_llga.release(module) can drop the compiled
// partitions of one module's groups (PyTorch keeps a traced module's code, and with it the kernels,
// until exit).
#include "jit/codegen/onednn/runtime/kernel_registry.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/api/function_impl.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "jit/codegen/onednn/mapping/llga_nodes.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/settings/choices.h"

namespace llga {

namespace {

// Never destroyed: a kernel destroyed at exit unregisters after this file's statics may be gone.
std::mutex& g_kernels_mutex = *new std::mutex;
std::unordered_multimap<int64_t, FusionKernel*>& g_kernels = *new std::unordered_multimap<int64_t, FusionKernel*>;  // by group id

}  // namespace

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

void register_kernel(int64_t group_id, FusionKernel* kernel) {
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  g_kernels.emplace(group_id, kernel);
}

void unregister_kernel(int64_t group_id, FusionKernel* kernel) {
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  auto [first, last] = g_kernels.equal_range(group_id);
  for (auto it = first; it != last; ++it)
    if (it->second == kernel) {
      g_kernels.erase(it);
      break;
    }
  if (g_kernels.count(group_id) == 0) choices::forget_group(group_id);
}

void release_groups(const std::unordered_set<int64_t>& group_ids) {
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  for (int64_t id : group_ids) {
    auto [first, last] = g_kernels.equal_range(id);
    for (auto it = first; it != last; ++it) it->second->release();
  }
}

int64_t release_compiled_partitions(const torch::jit::Graph* g) {
  std::unordered_set<int64_t> ids;
  if (g) collect_group_ids(g->block(), ids);
  int64_t before = runtime::stats().cached_partitions.load();
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  for (auto& [id, kernel] : g_kernels)
    if (!g || ids.count(id)) {
      kernel->release();
      choices::forget_group(id);  // measured again when it compiles again
    }
  return before - runtime::stats().cached_partitions.load();
}

}  // namespace llga
