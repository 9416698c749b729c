// The speed check: a compiled partition's first executions are timed against the group's ops run
// unfused, and one oneDNN runs far slower (a reference kernel) runs unfused from then on.
#include "jit/codegen/onednn/runtime/fusion_kernel.h"

#include <torch/csrc/jit/jit_log.h>

#include <chrono>
#include <ctime>

#include "jit/codegen/onednn/runtime/runtime.h"

namespace llga {

using torch::jit::Stack;

namespace {

// CPU time of the calling thread, in ns (not the time it waited for others or for a core).
double thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

}  // namespace

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
void FusionKernel::run_checking_speed(CompiledPartition& c, const Inputs& inputs, c10::ArrayRef<c10::IValue> args, Stack& stack) {
  constexpr double kSlowFactor = 5;
  constexpr double kSlowMarginNs = 25e6;
  std::unique_lock<std::mutex> lock(c.check_mutex);
  int left = c.checks_left.load(std::memory_order_relaxed);
  if (left == CompiledPartition::kSpeedChecks + 1 || left == 0) {  // the warm-up execution (or another thread's check ended)
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
  if (left - 1 == 0 && c.slow_verdicts == CompiledPartition::kSpeedChecks) {
    c.fallback = true;
    runtime::stats().slow_partitions.fetch_add(1, std::memory_order_relaxed);
    TORCH_WARN("torch_llga: oneDNN ran a fused group (", profiler_name_, ") ",
               static_cast<int64_t>(fused_ns / std::max(unfused_ns, 1.0)), "x slower than PyTorch runs its ops (",
               static_cast<int64_t>(fused_ns / 1e3), " against ", static_cast<int64_t>(unfused_ns / 1e3),
               " us): it runs unfused for these inputs. Please report the model (torch_llga.explain shows the group).");
  }
}

}  // namespace llga
