#pragma once
// A bounded cache of compiled things by key (a fusion group's compiled partitions by input layout;
// llga_to_dense's reorders by source layout), compiling each key once across threads and never
// under the lock: a thread compiling a new key (seconds, for a large partition) must not hold up
// the other threads' calls of keys already compiled. A second thread asking for a key being
// compiled waits for that compilation instead of compiling it again.
//
// The hit path takes the lock shared (no allocation, no exclusive lock): the calls of one group
// from several threads do not serialize on it. Least recently used first out: each entry keeps the
// tick of its last use (only counted when there is more than one entry to choose from).
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace llga {

// For tests only (torch_llga._C._test_delay_compile_ms): each compilation of a new key first sleeps
// this long, so a test can show that other threads' cached calls go on meanwhile. 0: no delay.
void set_compile_delay_for_tests(int64_t ms);
void delay_compile_for_tests();

template <typename T>
class CompileCache {
 public:
  using Key = c10::SmallVector<int64_t, 64>;

  // `evictions`: counted up per entry a full cache drops (may be null).
  explicit CompileCache(std::atomic<int64_t>* evictions = nullptr) : evictions_(evictions) {}

  // What `compile()` made for `key`: the cached result, the one another thread is making now
  // (waited for), or one made now by this thread outside the lock and kept, evicting the least
  // recently used entry beyond `capacity`. If compile() throws, the key is not kept and the threads
  // waiting for it try again.
  template <typename Compile>
  std::shared_ptr<T> get(c10::ArrayRef<int64_t> key, int64_t capacity, Compile&& compile) {
    for (;;) {
      std::shared_ptr<Entry> pending;
      {
        std::shared_lock<std::shared_mutex> lock(mutex_);
        if (const auto* e = find(key)) {
          if ((*e)->ready.load(std::memory_order_acquire)) return touch(**e);
          pending = *e;
        }
      }
      if (!pending) {
        std::unique_lock<std::shared_mutex> lock(mutex_);
        if (const auto* e = find(key)) {  // another thread came first
          if ((*e)->ready.load(std::memory_order_acquire)) return touch(**e);
          pending = *e;
        } else {
          auto mine = std::make_shared<Entry>();
          mine->key.assign(key.begin(), key.end());
          evict_down_to(std::max<int64_t>(capacity, 1) - 1);
          entries_.push_back(mine);
          lock.unlock();
          return compile_into(*mine, compile);
        }
      }
      std::unique_lock<std::mutex> lock(wait_mutex_);
      compiled_.wait(lock, [&] { return pending->ready.load(std::memory_order_acquire) || pending->failed; });
      if (pending->ready.load(std::memory_order_acquire)) return pending->value;
      // The compiling thread failed: try again (this thread may compile the key itself).
    }
  }

  // Drops every entry; calls holding one keep theirs, and a compilation under way completes for
  // the threads waiting for it without being kept.
  void clear() {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    entries_.clear();
  }

  size_t size() {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  struct Entry {
    std::vector<int64_t> key;
    std::shared_ptr<T> value;          // written once, before `ready`
    std::atomic<bool> ready{false};
    bool failed = false;               // under wait_mutex_
    std::atomic<uint64_t> last_use{0};
  };

  const std::shared_ptr<Entry>* find(c10::ArrayRef<int64_t> key) const {
    for (const auto& e : entries_)
      if (std::equal(key.begin(), key.end(), e->key.begin(), e->key.end())) return &e;
    return nullptr;
  }

  // A hit: the value, its entry marked used now (under the shared lock: a relaxed store).
  std::shared_ptr<T> touch(Entry& e) {
    if (entries_.size() > 1) e.last_use.store(tick_.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return e.value;
  }

  // Drops compiled entries, least recently used first, until at most n are left (mutex_ held
  // exclusively). Entries still compiling stay: their threads are about to use them.
  void evict_down_to(int64_t n) {
    while (static_cast<int64_t>(entries_.size()) > n) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if ((*it)->ready.load(std::memory_order_relaxed) &&
            (victim == entries_.end() || (*it)->last_use.load(std::memory_order_relaxed) < (*victim)->last_use.load(std::memory_order_relaxed)))
          victim = it;
      if (victim == entries_.end()) return;
      entries_.erase(victim);
      if (evictions_) evictions_->fetch_add(1, std::memory_order_relaxed);
    }
  }

  template <typename Compile>
  std::shared_ptr<T> compile_into(Entry& e, Compile& compile) {
    std::shared_ptr<T> value;
    try {
      delay_compile_for_tests();
      value = compile();
    } catch (...) {
      {
        std::unique_lock<std::shared_mutex> lock(mutex_);
        entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const auto& s) { return s.get() == &e; }), entries_.end());
      }
      {
        std::lock_guard<std::mutex> lock(wait_mutex_);
        e.failed = true;
      }
      compiled_.notify_all();
      throw;
    }
    e.value = value;
    e.last_use.store(tick_.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(wait_mutex_);  // a waiter between its test and its wait sees the store
      e.ready.store(true, std::memory_order_release);
    }
    compiled_.notify_all();
    return value;
  }

  std::shared_mutex mutex_;                    // entries_
  std::vector<std::shared_ptr<Entry>> entries_;
  std::atomic<uint64_t> tick_{0};
  std::mutex wait_mutex_;                      // with compiled_: threads waiting for a key being compiled
  std::condition_variable compiled_;
  std::atomic<int64_t>* evictions_;
};

}  // namespace llga
