// The test hook of compile_cache.h: a delay before each compilation of a new key.
#include "jit/codegen/onednn/runtime/compile_cache.h"

#include <chrono>
#include <thread>

namespace llga {

namespace {
std::atomic<int64_t> g_compile_delay_ms{0};
}  // namespace

void set_compile_delay_for_tests(int64_t ms) { g_compile_delay_ms.store(ms, std::memory_order_relaxed); }

void delay_compile_for_tests() {
  if (int64_t ms = g_compile_delay_ms.load(std::memory_order_relaxed); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace llga
