#pragma once
// Choices between ways to run the same ops (a oneDNN partition or PyTorch's ops, an own kernel or
// PyTorch's op), made by timing the candidates on the machine at hand, for the sizes a call brings,
// once; or pinned (tests, users who want reproducible kernels). Every choice is recorded
// (torch_llga.choices(), explain(), the `choices` log: PYTORCH_JIT_LOG_LEVEL=">>choices").
//
// Pins: TORCH_LLGA_CHOICES="site=candidate,..." when the library loads, or torch_llga.pin_choices();
// "default" as a site's candidate pins it to its default, "*=default" every site.
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace llga::choices {

// A place where a choice is made, and its candidates; the first is the default (what runs while a
// measurement is not made, and what a margin protects: another candidate must be clearly faster).
struct Site {
  const char* name;
  std::vector<const char*> candidates;
  // The default is kept unless another candidate's best time times `margin` plus `margin_ns` is
  // below the default's best time (margins: what the timing cannot see, e.g. a fused group's
  // outputs staying in oneDNN's layout for the next group).
  double margin;
  double margin_ns;
  const char* what;  // one line for docs and errors
};

// Every site (choices.cpp): the table a pin is checked against.
const std::vector<Site>& sites();
const Site& site(const char* name);  // throws for an unknown name

// The candidate a site is pinned to (its index), or nullopt: measured.
std::optional<size_t> pinned(const Site& s);
// Pins from "site=candidate,..." (empty: none). Throws std::invalid_argument, saying what is known.
void set_pins(const std::string& spec);
std::string pins();

// What was chosen, for one site and one key (the sizes and dtypes it was timed at).
struct Record {
  std::string site;
  std::string subject;  // which group or op (its profiler name)
  std::string key;      // the sizes and dtypes
  std::string chosen;
  std::string how;      // "measured", "pinned", "kept: machine busy" (choices::machine_busy)
  std::vector<std::pair<std::string, double>> best_us;  // per candidate timed: its best time
  int64_t group_id = -1;
  double margin = 0, margin_ns = 0;  // the margin the choice was made with
  int64_t seq = 0;  // set by record(): the order of all records
};
void record(Record r);  // logged (">>choices") and kept (the last 10,000)
// A dropped group's records go with it (its last kernel destroyed: the module released or freed),
// so that a service reloading models keeps the records of what is alive, not a history.
void forget_group(int64_t group_id);
std::vector<Record> records();
int64_t measured_count();

// Whether more threads are runnable now than the machine has cores (/proc/stat's procs_running):
// another process's work would time in with a candidate's (an OpenMP region waits for its
// descheduled thread: a 2-thread oneDNN group timed beside a compiler took 7 ms, 30x its own), so
// no measurement is made then; the default runs and the measurement is tried again later.
bool machine_busy();
// 1 or 0: machine_busy() says so; -1: /proc/stat again (TORCH_LLGA_MACHINE_BUSY sets it at start-up).
void set_machine_busy_for_tests(int busy);
// How many calls a site tries to find the machine not busy before it keeps its default untimed.
constexpr int kBusyTries = 64;

// Nanoseconds of the steady clock, and of the calling thread's CPU.
double now_ns();
double thread_cpu_ns();

// A timed choice between candidates that can each be run on the same inputs (pure functions of
// them): the first call at a key runs them interleaved for up to `kRounds` rounds (fewer when
// the default's best is under half of every other's after two: the answer is clear), keeps each one's best
// wall time, chooses, records; `run(i)` runs candidate i and returns its result, the chosen
// candidate's last result is the call's. Later calls at that key run the choice.
// What a choice is keyed by: sizes and dtypes as numbers (built per call without allocating).
using Key = std::array<int64_t, 8>;
// A count (rows, say) in a key as its power-of-two bucket: sizes that vary call by call (a
// prompt's length) are measured once a bucket, not once a size.
inline int64_t bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b <<= 1;
  return b;
}

template <typename Result>
class Chooser {
 public:
  static constexpr int kRounds = 3;
  explicit Chooser(const char* site_name) : site_(site(site_name)) {}

  // describe(): the record's subject and key, built only when a choice is recorded.
  template <typename Describe, typename Run>
  Result run(const Key& key, const Describe& describe, const Run& run_candidate) {
    if (auto p = pinned(site_)) {
      note(key, describe, *p, "pinned", {});
      return run_candidate(*p);
    }
    std::optional<size_t> known;
    bool busy = false, give_up = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [k, i] : decided_)
        if (k == key) known = i;
      if (!known && (busy = machine_busy())) {  // not now: the default, and another try at a later call
        give_up = ++busy_tries_[key] >= kBusyTries;
        if (give_up) decided_.emplace_back(key, 0);
      }
    }
    if (known) return run_candidate(*known);
    if (give_up) note(key, describe, 0, "kept: machine busy", {});
    if (busy) return run_candidate(0);
    const size_t n = site_.candidates.size();
    std::vector<double> best(n, 1e300);
    std::vector<std::optional<Result>> results(n);
    for (int round = 0; round < kRounds; ++round) {
      for (size_t j = n; j-- > 0;) {  // the default last: its result is the likely answer
        double start = now_ns();
        results[j] = run_candidate(j);
        best[j] = std::min(best[j], now_ns() - start);
      }
      // (not after the first round: a candidate's first run may include its one-time setup, such
      // as compiling oneDNN's kernel for these sizes)
      bool clear = round >= 1;
      for (size_t j = 1; j < n; ++j) clear = clear && best[0] * 2 < best[j];
      if (clear) break;
    }
    size_t chosen = 0;
    for (size_t j = 1; j < n; ++j)
      if (best[j] * site_.margin + site_.margin_ns < best[chosen] && best[j] < best[chosen]) chosen = j;
    std::vector<std::pair<std::string, double>> times;
    for (size_t j = 0; j < n; ++j) times.emplace_back(site_.candidates[j], best[j] / 1e3);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      decided_.emplace_back(key, chosen);
    }
    note(key, describe, chosen, "measured", std::move(times));
    return std::move(*results[chosen]);
  }

 private:
  template <typename Describe>
  void note(const Key& key, const Describe& describe, size_t chosen, const char* how,
            std::vector<std::pair<std::string, double>> times) {
    if (std::strcmp(how, "pinned") == 0) {  // once per key and candidate (no allocation per call)
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [k, i] : pinned_noted_)
        if (k == key && i == chosen) return;
      pinned_noted_.emplace_back(key, chosen);
    }
    auto [subject, described_key] = describe();
    record({site_.name, std::move(subject), std::move(described_key), site_.candidates[chosen], how, std::move(times), -1,
            site_.margin, site_.margin_ns});
  }

  const Site& site_;
  std::mutex mutex_;
  std::vector<std::pair<Key, size_t>> decided_, pinned_noted_;
  std::map<Key, int> busy_tries_;
};

}  // namespace llga::choices
