// The allocator of oneDNN's buffers and of LLGA tensors' memory: buffers of 1 KiB and more are kept
// when freed, for the next request of their size. It sits below both the LLGA tensor and the fuser's
// runtime (which hands it to oneDNN's engine), so the tensor type needs nothing from the fuser.
#include "onednn/buffer_pool.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include <sys/mman.h>

namespace llga::onednn {

namespace {

std::atomic<int64_t> g_kept_bytes{0};  // what publish() last saw (kept_buffer_bytes())

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
// the pool's limit is kept: 256 MB, TORCH_LLGA_BUFFER_POOL_MB, or set_buffer_pool_limit().
//
// Smaller buffers, from 1 KiB, are kept too, in power-of-two sizes: glibc serves an aligned
// request of that size by first merging its free small chunks (malloc_consolidate, on nearly every
// partition execution here). Measured on 40 partitions of a 1x1 conv at 16x4x4, one thread:
// allocation was a fifth of the time, malloc_consolidate alone 4.6%.
//
// A request takes the buffer freed last among the kept ones of its size up to twice it, not the
// last one of its exact size: a tensor that just died is likeliest still in the caches, and the
// next output overwrites it there (what an inference engine's memory plan does, one arena for
// tensors whose lifetimes do not overlap). Measured on Zen 4, 2 threads, paired in one process:
// MobileNetV2 7% faster while the shared machine was quiet (3.6-4.4 ms a call), 0-4% slower in
// its busy spans (4.6-5.5 ms); ResNet-50, BERT-base, ViT-B/16, LLD6 and XML-CNN unchanged
// (0.99-1.01). Up to 4x instead: 7-10% quiet, 9% slower busy. A buffer may thus hold up to twice
// the bytes its tensor needs.
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kLargeFrom = size_t(64) << 10;  // sizes from here in 64 KiB steps, below in powers of two
constexpr size_t kPooledFrom = size_t(1) << 10;
constexpr size_t kReuseUpTo = 2;  // a request may take a kept buffer up to this many times its size
#ifdef __SANITIZE_ADDRESS__
constexpr bool kPoolAllowed = false;  // AddressSanitizer sees every free (a kept buffer would hide a use after free)
#else
constexpr bool kPoolAllowed = true;
#endif
constexpr int64_t kDefaultPoolMB = 256;

// TORCH_LLGA_BUFFER_POOL_MB in bytes; an unreadable value gives the default and its error.
size_t pool_limit_from_env(std::string* error) {
  const char* env = std::getenv("TORCH_LLGA_BUFFER_POOL_MB");
  if (!env || !*env) return size_t(kDefaultPoolMB) << 20;
  char* end = nullptr;
  errno = 0;
  long long mb = std::strtoll(env, &end, 10);
  if (*end != '\0' || mb < 0 || errno || mb > (int64_t(1) << 40)) {
    if (error) *error = "TORCH_LLGA_BUFFER_POOL_MB must be a whole number of megabytes (0 keeps nothing), not '" + std::string(env) + "'";
    return size_t(kDefaultPoolMB) << 20;
  }
  return size_t(mb) << 20;
}

constexpr size_t kPoolAlignment = 128;  // of every pooled buffer under 2 MiB: oneDNN asks for 64 or 128

class BufferPool {
 public:
  void* allocate(size_t size, size_t alignment) {
    if (size < kPooledFrom || alignment > kPoolAlignment) return allocate_new(size, alignment);
    size_t rounded = round(size);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // The buffer freed last among those of this size up to kReuseUpTo times it: the likeliest
      // still in the caches (a dead tensor's lines, written over before they leave them).
      auto best = by_size_.end();
      const size_t largest = rounded * kReuseUpTo;
      for (auto it = by_size_.lower_bound(rounded); it != by_size_.end() && it->first <= largest; ++it)
        if (best == by_size_.end() || it->second.back()->stamp > best->second.back()->stamp) best = it;
      if (best != by_size_.end()) {
        auto kept = best->second.back();
        best->second.pop_back();
        if (best->second.empty()) by_size_.erase(best);  // only sizes with kept buffers are listed
        void* p = kept->p;
        pooled_bytes_ -= kept->size;
        kept_.erase(kept);
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

  // Keeps p for reuse. Over the limit, the buffers kept longest make room (a workload whose sizes
  // changed keeps its current ones), unless p alone is larger.
  void deallocate(void* p) {
    if (!p) return;
    std::vector<void*> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = size_of_.find(p);
      if (it == size_of_.end()) {
        released.push_back(p);  // not pooled (small)
      } else if (it->second > limit_) {
        size_of_.erase(it);
        released.push_back(p);
      } else {
        const size_t size = it->second;
        evict_until(limit_ - size, released);
        kept_.push_back({size, p, ++stamp_});
        by_size_[size].push_back(std::prev(kept_.end()));
        pooled_bytes_ += size;
        publish();
      }
    }
    for (void* q : released) free(q);
  }

  // Gives the kept buffers back to the system (release(): a dropped module's weights among them).
  void trim() { set_limit(limit(), /*keep=*/0); }

  size_t limit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }

  // From now on keeps at most `bytes`; of the buffers kept now, at most `keep` bytes (the
  // earliest kept go first).
  void set_limit(size_t bytes, size_t keep) {
    std::vector<void*> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = kPoolAllowed ? bytes : 0;
      evict_until(std::min(keep, limit_), released);
      publish();
    }
    for (void* p : released) free(p);
  }

 private:
  struct KeptBuffer {
    size_t size;     // rounded
    void* p;
    uint64_t stamp;  // when kept: later ones larger
  };
  using Kept = std::list<KeptBuffer>;  // the earliest kept first

  static size_t round(size_t size) {
    if (size < kLargeFrom) return std::bit_ceil(size);
    size_t unit = size >= kHugePage ? kHugePage : kLargeFrom;
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

  // Drops kept buffers, the earliest kept first, until at most `bytes` are kept (mutex_ held).
  void evict_until(size_t bytes, std::vector<void*>& released) {
    while (!kept_.empty() && pooled_bytes_ > bytes) {
      const size_t size = kept_.front().size;
      void* p = kept_.front().p;
      auto same = by_size_.find(size);
      same->second.pop_front();  // kept_ and each by_size_ list are in the order buffers were kept
      if (same->second.empty()) by_size_.erase(same);
      kept_.pop_front();
      size_of_.erase(p);
      pooled_bytes_ -= size;
      released.push_back(p);
    }
  }

  void publish() { g_kept_bytes.store(static_cast<int64_t>(pooled_bytes_), std::memory_order_relaxed); }

  std::mutex mutex_;
  Kept kept_;
  std::map<size_t, std::deque<Kept::iterator>> by_size_;  // rounded size -> its kept buffers, in kept_'s order
  uint64_t stamp_ = 0;
  std::unordered_map<void*, size_t> size_of_;             // every pooled buffer, in use or kept
  size_t pooled_bytes_ = 0;
  size_t limit_ = kPoolAllowed ? initial_limit() : 0;

  // Python's import refuses an unreadable TORCH_LLGA_BUFFER_POOL_MB; a C++ program is told here.
  static size_t initial_limit() {
    std::string error;
    size_t bytes = pool_limit_from_env(&error);
    if (!error.empty()) std::fprintf(stderr, "torch_llga: %s; the pool keeps up to %lld MB\n", error.c_str(), (long long)kDefaultPoolMB);
    return bytes;
  }
};

BufferPool& pool() {
  static BufferPool* p = new BufferPool();  // never destroyed: oneDNN's cache may free into it at exit
  return *p;
}
}  // namespace

void* allocate_buffer(size_t size, size_t alignment) { return pool().allocate(size, alignment); }
void free_buffer(void* p) { pool().deallocate(p); }
std::string buffer_pool_env_error() {
  std::string error;
  pool_limit_from_env(&error);
  return error;
}
int64_t buffer_pool_limit() { return static_cast<int64_t>(pool().limit()); }
void set_buffer_pool_limit(int64_t bytes) { pool().set_limit(static_cast<size_t>(bytes), static_cast<size_t>(bytes)); }
int64_t kept_buffer_bytes() { return g_kept_bytes.load(std::memory_order_relaxed); }
void trim_buffer_pool() { pool().trim(); }

}  // namespace llga::onednn
