#include "jit/codegen/onednn/runtime.h"

#include "onednn/torch_onednn.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <sys/mman.h>

namespace llga::runtime {

namespace {
// TORCH_LLGA_ENABLE=1 turns the fuser on when the library loads (servers gain it without code changes).
// Without torch's oneDNN it stays off, and says why (a server that preloads the library should not
// fail to start, nor fuse silently nothing).
bool enabled_by_environment() {
  const char* env = std::getenv("TORCH_LLGA_ENABLE");
  if (!env || std::strcmp(env, "1") != 0) return false;
  if (!onednn::load_error().empty()) std::fprintf(stderr, "%s; the fuser stays off\n", onednn::load_error().c_str());
  return true;
}

std::atomic<bool> g_enabled{enabled_by_environment()};
std::atomic<bool> g_fuse_all_partitions{false};
std::atomic<ShapePolicy> g_shape_policy{ShapePolicy::kCompile};
std::atomic<int64_t> g_cache_capacity{16};
std::atomic<bool> g_small_plans{!std::getenv("TORCH_LLGA_SMALL_PLANS") || std::strcmp(std::getenv("TORCH_LLGA_SMALL_PLANS"), "0") != 0};

// The constant weight cache: oneDNN keeps the reordered copy of each constant (frozen weight)
// input so weights are reordered once, not per call. On by default; DNNL_GRAPH_CONSTANT_CACHE=0
// turns it off. oneDNN's capacity is in MB and, once reached, it caches nothing more (no eviction):
// 1 TiB means "unbounded", the old on/off switch's meaning. An explicit
// ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY is left to oneDNN. Set before the first compilation
// (it applies to partitions compiled after it), when the engine is made.
constexpr size_t kConstantCacheMB = size_t(1) << 20;
void init_constant_cache() {
  if (std::getenv("ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY")) return;
  const char* env = std::getenv("DNNL_GRAPH_CONSTANT_CACHE");
  dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, env && std::strcmp(env, "0") == 0 ? 0 : kConstantCacheMB);
}

// oneDNN's buffers (the constant cache's reordered weights above all) in transparent huge pages
// where the kernel grants them on request (THP "madvise" mode): a model's weights are streamed
// from memory on every call, and 4 KiB pages cost a TLB miss every 4 KiB. Measured: BERT-base 2-5%
// faster (fp32 and bf16); buffers under 2 MiB are left as they were.
//
// Buffers of 64 KiB and more are kept when oneDNN frees them, for its next request of that size:
// a partition's scratchpad and temporaries (an input reordered to NHWC, a 1x1 conv's output
// before its fused depthwise conv) are allocated and freed on every execution, and memory fresh
// from the kernel costs a fault per page, a whole 2 MiB huge page zeroed for the large ones.
// Measured: a MobileNetV2 block at 56x56 spent a third of its time zeroing pages. At most
// kPoolBytes are kept.
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kPooledFrom = size_t(64) << 10;
#ifdef __SANITIZE_ADDRESS__
constexpr size_t kPoolBytes = 0;  // AddressSanitizer sees every free (a kept buffer would hide a use after free)
#else
constexpr size_t kPoolBytes = size_t(256) << 20;
#endif
constexpr size_t kPoolAlignment = 128;  // of every pooled buffer under 2 MiB: oneDNN asks for 64 or 128

class BufferPool {
 public:
  void* allocate(size_t size, size_t alignment) {
    if (size < kPooledFrom || alignment > kPoolAlignment) return allocate_new(size, alignment);
    size_t rounded = round(size);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        pooled_bytes_ -= rounded;
        publish();
        return p;
      }
    }
    void* p = allocate_new(rounded, rounded >= kHugePage ? kHugePage : kPoolAlignment);
    if (p) {
      std::lock_guard<std::mutex> lock(mutex_);
      size_of_[p] = rounded;
    }
    return p;
  }

  // Gives the kept buffers back to the system (release(): a dropped module's weights among them).
  void trim() {
    std::vector<void*> kept;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, p] : free_) {
        kept.push_back(p);
        size_of_.erase(p);
      }
      free_.clear();
      pooled_bytes_ = 0;
      publish();
    }
    for (void* p : kept) free(p);
  }

  // Keeps p for reuse. Over the cap, buffers kept earlier make room (a workload whose sizes
  // changed keeps its current ones), unless p alone is larger.
  void deallocate(void* p) {
    if (!p) return;
    std::vector<void*> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = size_of_.find(p);
      if (it == size_of_.end()) {
        released.push_back(p);  // not pooled (small)
      } else if (it->second > kPoolBytes) {
        size_of_.erase(it);
        released.push_back(p);
      } else {
        const size_t size = it->second;
        while (pooled_bytes_ + size > kPoolBytes) {
          auto old = free_.begin();
          released.push_back(old->second);
          size_of_.erase(old->second);
          pooled_bytes_ -= old->first;
          free_.erase(old);
        }
        pooled_bytes_ += size;
        free_.emplace(size, p);
        publish();
      }
    }
    for (void* q : released) free(q);
  }

 private:
  static size_t round(size_t size) {
    size_t unit = size >= kHugePage ? kHugePage : kPooledFrom;
    return (size + unit - 1) / unit * unit;
  }
  static void* allocate_new(size_t size, size_t alignment) {
    void* p = nullptr;
    if (size >= kHugePage) {
      size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
      if (posix_memalign(&p, kHugePage, rounded) != 0) return nullptr;
      madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without THP the pages stay small
      return p;
    }
    return posix_memalign(&p, std::max<size_t>(alignment, 64), size) == 0 ? p : nullptr;
  }

  void publish() { stats().kept_buffer_bytes.store(static_cast<int64_t>(pooled_bytes_), std::memory_order_relaxed); }

  std::mutex mutex_;
  std::unordered_multimap<size_t, void*> free_;  // rounded size -> a kept buffer
  std::unordered_map<void*, size_t> size_of_;    // every pooled buffer, in use or kept
  size_t pooled_bytes_ = 0;
};

BufferPool& pool() {
  static BufferPool* p = new BufferPool();  // never destroyed: oneDNN's cache may free into it at exit
  return *p;
}
}  // namespace

void* allocate_buffer(size_t size, size_t alignment) { return pool().allocate(size, alignment); }
void free_buffer(void* p) { pool().deallocate(p); }

bool constant_cache_enabled() {
  engine();  // the capacity is set with the engine
  return dnnl::graph::get_constant_tensor_cache_capacity(dnnl::engine::kind::cpu) > 0;
}

void flush_constant_cache() {
  size_t capacity = (engine(), dnnl::graph::get_constant_tensor_cache_capacity(dnnl::engine::kind::cpu));
  if (capacity != 0) {
    dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, 0);  // setting it flushes
    dnnl::graph::set_constant_tensor_cache_capacity(dnnl::engine::kind::cpu, capacity);
  }
  pool().trim();  // the buffers kept for reuse, the flushed weights among them
}

dnnl::engine& engine() {
  static dnnl::engine e = (init_constant_cache(), dnnl::graph::make_engine_with_allocator(dnnl::engine::kind::cpu, 0, dnnl::graph::allocator(allocate_buffer, free_buffer)));
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

Stats& stats() {
  static Stats s;
  return s;
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed) && onednn::load_error().empty(); }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool fuse_all_partitions() { return g_fuse_all_partitions.load(std::memory_order_relaxed); }
void set_fuse_all_partitions(bool on) { g_fuse_all_partitions.store(on, std::memory_order_relaxed); }
ShapePolicy shape_policy() { return g_shape_policy.load(std::memory_order_relaxed); }
void set_shape_policy(ShapePolicy p) { g_shape_policy.store(p, std::memory_order_relaxed); }
bool small_plans_enabled() { return g_small_plans.load(std::memory_order_relaxed); }
void set_small_plans_enabled(bool on) { g_small_plans.store(on, std::memory_order_relaxed); }
int64_t cache_capacity() { return g_cache_capacity.load(std::memory_order_relaxed); }
void set_cache_capacity(int64_t n) { g_cache_capacity.store(n, std::memory_order_relaxed); }

}  // namespace llga::runtime
