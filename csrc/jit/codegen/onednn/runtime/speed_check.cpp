// The measured choice of a fused group (choice site "fusion_group", settings/choices.h): its
// compiled partition's first executions are timed against the group's ops run unfused by PyTorch,
// on the same inputs, and the faster runs from then on.
#include "jit/codegen/onednn/runtime/fusion_kernel.h"

#include <torch/csrc/jit/jit_log.h>

#include <algorithm>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/runtime/runtime.h"
#include "jit/codegen/onednn/settings/choices.h"

namespace llga {

using torch::jit::Stack;

namespace {

const choices::Site& fusion_group_site() {
  static const choices::Site& s = choices::site("fusion_group");
  return s;
}

// "[1, 128, 576] BFloat16, ..." of the group's tensor inputs (their dense sizes for LLGA tensors).
std::string describe(c10::ArrayRef<at::Tensor> inputs) {
  std::string s;
  for (const at::Tensor& t : inputs) {
    if (!t.defined()) continue;
    s += s.empty() ? "" : ", ";
    s += c10::str(t.sizes(), " ", t.scalar_type());
  }
  return s;
}

}  // namespace

// oneDNN runs some partitions with a reference kernel, 7-3700x slower than PyTorch runs the same
// ops, and on some CPUs a kernel of its own is slower than PyTorch's for a group's sizes (which
// ones differ between CPUs: a bf16 RMSNorm partition runs a reference kernel where AMX is). So a
// compiled partition's 2nd to 4th executions each also run the group's ops unfused, first (an
// in-place output may overwrite an input), on the same inputs, and time both; the partition is
// kept unless the unfused ops beat it by the site's margin in every round, on the wall clock and
// the calling thread's CPU time alike (with other processes on the cores an OpenMP
// region waits for a descheduled thread: the CPU time does not count that). A partition under half
// the unfused ops' time after any round is kept at once (the common case: one extra unfused run).
void FusionKernel::run_checking_speed(CompiledPartition& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, Stack& stack) {
  const choices::Site& site = fusion_group_site();
  std::unique_lock<std::mutex> lock(c.check_mutex);
  int left = c.checks_left.load(std::memory_order_relaxed);
  if (left == 0) {  // another thread's check ended meanwhile
    lock.unlock();
    return c.fallback.load(std::memory_order_relaxed) ? run_unfused_by_choice(stack) : execute(c, inputs, args, stack);
  }
  auto decide = [&](bool unfused, const char* how) {
    c.checks_left.store(0, std::memory_order_relaxed);
    std::vector<std::pair<std::string, double>> times;
    if (c.fused_ns < 1e300) times = {{"onednn", c.fused_ns / 1e3}, {"pytorch", c.unfused_ns / 1e3}};
    choices::record({"fusion_group", profiler_name_, describe(inputs), unfused ? "pytorch" : "onednn", how, std::move(times),
                     group_id_, c.margin, c.margin_ns});
    if (unfused) {
      c.chosen_unfused = true;
      c.fallback = true;
      if (std::string(how) == "measured") runtime::stats().slow_partitions.fetch_add(1, std::memory_order_relaxed);
    }
  };
  if (auto pin = choices::pinned(site)) {
    decide(*pin == 1, "pinned");
    lock.unlock();
    return *pin == 1 ? run_unfused_by_choice(stack) : execute(c, inputs, args, stack);
  }
  if (left == CompiledPartition::kSpeedChecks + 1) {  // the warm-up execution (weights reordered, buffers made)
    c.checks_left.store(left - 1, std::memory_order_relaxed);
    lock.unlock();
    return execute(c, inputs, args, stack);
  }
  if (choices::machine_busy()) {  // no timing beside other work: the partition, and a try at a later call
    if (++c.busy_calls >= choices::kBusyTries) decide(false, "kept: machine busy");
    lock.unlock();
    return execute(c, inputs, args, stack);
  }
  double start = choices::now_ns(), start_cpu = choices::thread_cpu_ns();
  try {
    Stack unfused(args.begin(), args.end());
    for_pytorch(unfused);
    torch::jit::InterpreterState(fallback_code()).run(unfused);
  } catch (const std::exception& e) {  // no verdict: the partition stays
    GRAPH_DEBUG("The speed check's unfused run failed (", e.what(), ")");
    decide(false, "measured");
    lock.unlock();
    return execute(c, inputs, args, stack);
  }
  double middle = choices::now_ns(), middle_cpu = choices::thread_cpu_ns();
  execute(c, inputs, args, stack);
  double end = choices::now_ns(), end_cpu = choices::thread_cpu_ns();
  const double margin = site.margin, margin_ns = site.margin_ns;
  c.margin = margin;
  c.margin_ns = margin_ns;
  auto faster_unfused = [&](double fused, double unfused) { return unfused * margin + margin_ns < fused; };
  c.unfused_wins += faster_unfused(end - middle, middle - start) && faster_unfused(end_cpu - middle_cpu, middle_cpu - start_cpu);
  c.unfused_ns = std::min(c.unfused_ns, middle - start);
  c.fused_ns = std::min(c.fused_ns, end - middle);
  c.unfused_cpu_ns = std::min(c.unfused_cpu_ns, middle_cpu - start_cpu);
  c.fused_cpu_ns = std::min(c.fused_cpu_ns, end_cpu - middle_cpu);
  if (c.fused_ns * 2 < c.unfused_ns) return decide(false, "measured");
  if (left - 1 > 0) {
    c.checks_left.store(left - 1, std::memory_order_relaxed);
    return;
  }
  // PyTorch's ops only where they won every round (a round a stalled thread slowed cannot decide it).
  bool unfused = c.unfused_wins == CompiledPartition::kSpeedChecks;
  decide(unfused, "measured");
  if (unfused && c.fused_ns > 5 * c.unfused_ns && !held_back_op_) {  // likely a reference kernel: worth a report
    TORCH_WARN_ONCE("torch_llga: PyTorch ran the ops of a fused group (", profiler_name_, ") ",
                    static_cast<int64_t>(c.fused_ns / std::max(c.unfused_ns, 1.0)), "x faster than oneDNN (",
                    static_cast<int64_t>(c.unfused_ns / 1e3), " against ", static_cast<int64_t>(c.fused_ns / 1e3),
                    " us): they run unfused for these inputs (torch_llga.choices() lists every such choice). Please report the model.");
  }
}

}  // namespace llga
