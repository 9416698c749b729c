// The fuser's switch, knobs and counters (settings.h).
#include "jit/codegen/onednn/settings/settings.h"

#include "build_info.h"
#include "onednn/torch_onednn.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace llga::runtime {

namespace {
// TORCH_LLGA_ENABLE=1 turns the fuser on when the library loads (servers gain it without code changes).
// Without torch's oneDNN it stays off, and says why (a server that preloads the library should not
// fail to start, nor fuse silently nothing).
bool enabled_by_environment() {
  const char* env = std::getenv("TORCH_LLGA_ENABLE");
  if (!env || std::strcmp(env, "1") != 0) return false;
  for (const std::string* error : {&onednn::load_error(), &torch_mismatch()})
    if (!error->empty()) std::fprintf(stderr, "%s; the fuser stays off\n", error->c_str());
  return true;
}

std::atomic<bool> g_enabled{enabled_by_environment()};
std::atomic<bool> g_fuse_all_partitions{false};
std::atomic<ShapePolicy> g_shape_policy{ShapePolicy::kCompile};
std::atomic<int64_t> g_cache_capacity{16};
thread_local bool t_enabled = false;
std::atomic<bool> g_small_plans{!std::getenv("TORCH_LLGA_SMALL_PLANS") || std::strcmp(std::getenv("TORCH_LLGA_SMALL_PLANS"), "0") != 0};

// Either switch counts only with torch's oneDNN bound and the torch this build is for.
bool fusing_allowed() { return onednn::load_error().empty() && torch_mismatch().empty(); }

}  // namespace

Stats& stats() {
  static Stats s;
  return s;
}

bool enabled() { return fusing_allowed() && g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool set_enabled_in_thread(bool on) { return std::exchange(t_enabled, on); }
bool fusing() { return fusing_allowed() && (t_enabled || g_enabled.load(std::memory_order_relaxed)); }
bool fuse_all_partitions() { return g_fuse_all_partitions.load(std::memory_order_relaxed); }
void set_fuse_all_partitions(bool on) { g_fuse_all_partitions.store(on, std::memory_order_relaxed); }
ShapePolicy shape_policy() { return g_shape_policy.load(std::memory_order_relaxed); }
void set_shape_policy(ShapePolicy p) { g_shape_policy.store(p, std::memory_order_relaxed); }
bool own_kernels_enabled() {
  const char* v = std::getenv("TORCH_LLGA_OWN_KERNELS");
  return !v || std::strcmp(v, "0") != 0;
}
bool small_plans_enabled() { return g_small_plans.load(std::memory_order_relaxed); }
void set_small_plans_enabled(bool on) { g_small_plans.store(on, std::memory_order_relaxed); }
namespace {
std::mutex g_switch_mutex;
std::vector<std::string> g_switched_off = [] {  // under g_switch_mutex
  std::vector<std::string> names;
  if (const char* env = std::getenv("TORCH_LLGA_PASSES_OFF")) {
    std::string list = env;
    for (size_t start = 0; start <= list.size();) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      std::string name = list.substr(start, end - start);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      if (!name.empty()) names.push_back(name);
      start = end + 1;
    }
  }
  return names;
}();
std::atomic<bool> g_any_switched_off{!g_switched_off.empty()};
}  // namespace

bool switched_off(const char* name) {
  if (!g_any_switched_off.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  for (const auto& n : g_switched_off)
    if (n == name) return true;
  return false;
}
void set_switched_off(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  g_switched_off = names;
  g_any_switched_off.store(!names.empty(), std::memory_order_relaxed);
}
std::vector<std::string> switched_off_names() {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  return g_switched_off;
}

int64_t cache_capacity() { return g_cache_capacity.load(std::memory_order_relaxed); }
void set_cache_capacity(int64_t n) { g_cache_capacity.store(n, std::memory_order_relaxed); }

}  // namespace llga::runtime
