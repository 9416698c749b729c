// The choice sites, their pins and the record of what was chosen (choices.h).
#include "jit/codegen/onednn/settings/choices.h"

#include <torch/csrc/jit/jit_log.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <unistd.h>
#include <deque>
#include <sstream>
#include <stdexcept>

namespace llga::choices {

namespace {

constexpr size_t kKeptRecords = 10000;

// The mutex and the records outlive every static (never destroyed): a fusion kernel destroyed at
// exit forgets its group's records (forget_group) after this file's statics may be gone.
std::mutex& g_mutex = *new std::mutex;
std::vector<std::pair<const Site*, size_t>> g_pins;  // under g_mutex
std::atomic<bool> g_any_pin{false};
std::deque<Record>& g_records = *new std::deque<Record>;  // under g_mutex
std::atomic<int64_t> g_measured{0};
int64_t g_seq = 0;  // under g_mutex

std::string known_sites() {
  std::string s;
  for (const Site& site : sites()) {
    s += s.empty() ? "" : "; ";
    s += std::string(site.name) + ":";
    for (const char* c : site.candidates) s += std::string(" ") + c;
  }
  return s;
}

const bool pins_from_environment = [] {
  if (const char* env = std::getenv("TORCH_LLGA_CHOICES")) {
    try {
      set_pins(env);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_llga: TORCH_LLGA_CHOICES ignored: %s\n", e.what());
    }
  }
  return true;
}();

}  // namespace

const std::vector<Site>& sites() {
  // Margins: a fused group's outputs may stay in oneDNN's layout for the next group and its inputs
  // need no conversion, which timing the group alone does not see, and on tiny tensors a few
  // microseconds decide nothing; own kernels and PyTorch's ops hand over the same plain tensors
  // (the margin only keeps noise from flipping a tie).
  static const std::vector<Site> table = {
      {"fusion_group", {"onednn", "pytorch"}, 1.5, 50e3,
       "a fused group: its oneDNN partition, or its ops run by PyTorch (a reference kernel loses)"},
      {"speed_rule", {"pytorch", "onednn"}, 1.05, 0,
       "a group with an op a measured speed rule keeps out (onednn_quirks.h): the op in PyTorch, or in the group"},
      {"row_linear", {"own", "pytorch"}, 1.1, 0, "a linear of 1-4 rows: llga::row_linear, or at::linear"},
      {"rms_norm_row_linear", {"own", "pytorch"}, 1.1, 0,
       "an RMSNorm and the linear of 1-4 rows after it: llga::rms_norm_row_linear, or at::rms_norm + at::linear"},
      {"widened_linear", {"own", "pytorch"}, 1.1, 0, "a bf16 linear: fp32 GEMMs over widened weight blocks, or at::linear"},
      {"layer_norm", {"own", "pytorch"}, 1.1, 0, "an fp32 layer norm before a quantize: llga::layer_norm, or at::layer_norm"},
      {"head64_attention", {"own", "onednn", "pytorch"}, 1.1, 0,
       "attention of 64-wide heads, 96+ queries: llga::head64_attention, oneDNN's SDPA, or at::scaled_dot_product_attention"},
      {"small_head_attention", {"own", "onednn", "pytorch"}, 1.1, 0,
       "attention of 8- or 16-wide heads over 512+ keys: llga::small_head_attention, oneDNN's SDPA, or at::scaled_dot_product_attention"},
      {"long_attention", {"pytorch", "onednn"}, 1.1, 0,
       "unmasked fp32 attention over 1,024+ keys no own kernel takes: PyTorch's flash kernel, or oneDNN's SDPA"},
      {"decode_attention", {"own", "pytorch"}, 1.1, 0,
       "a decoder step's attention over its KV cache: llga::decode_attention, or at::scaled_dot_product_attention"},
      {"quantize_per_tensor", {"own", "pytorch"}, 1.1, 0, "an fp32 -> int8 quantize: llga::quantize_per_tensor, or PyTorch's"},
      {"quantized_pool", {"own", "pytorch"}, 1.1, 0,
       "an int8 global average or max pool: llga's on the codes, or PyTorch's dequantize, pool, quantize"},
  };
  return table;
}

const Site& site(const char* name) {
  for (const Site& s : sites())
    if (std::strcmp(s.name, name) == 0) return s;
  throw std::invalid_argument(std::string("no choice site '") + name + "'; known: " + known_sites());
}

std::optional<size_t> pinned(const Site& s) {
  if (!g_any_pin.load(std::memory_order_relaxed)) return std::nullopt;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [site, i] : g_pins)
    if (site == &s) return i;
  return std::nullopt;
}

void set_pins(const std::string& spec) {
  std::vector<std::pair<const Site*, size_t>> pins;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("a pin is site=candidate, not '" + item + "'; known: " + known_sites());
    std::string name = item.substr(0, eq), candidate = item.substr(eq + 1);
    auto trim = [](std::string& s) {
      s.erase(0, s.find_first_not_of(' '));
      s.erase(s.find_last_not_of(' ') + 1);
    };
    trim(name);
    trim(candidate);
    std::vector<const Site*> targets;
    if (name == "*") {
      if (candidate != "default") throw std::invalid_argument("'*' pins every site to its default only ('*=default')");
      for (const Site& s : sites()) targets.push_back(&s);
    } else {
      targets.push_back(&site(name.c_str()));
    }
    for (const Site* s : targets) {
      size_t index = s->candidates.size();
      for (size_t i = 0; i < s->candidates.size(); ++i)
        if (candidate == s->candidates[i] || (candidate == "default" && i == 0)) index = i;
      if (index == s->candidates.size())
        throw std::invalid_argument("site '" + std::string(s->name) + "' has no candidate '" + candidate + "'; known: " +
                                    known_sites());
      pins.emplace_back(s, index);
    }
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pins = std::move(pins);
  g_any_pin.store(!g_pins.empty(), std::memory_order_relaxed);
}

std::string pins() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string s;
  for (const auto& [site, i] : g_pins) s += (s.empty() ? "" : ",") + std::string(site->name) + "=" + site->candidates[i];
  return s;
}

void record(Record r) {
  if (r.how == "measured") g_measured.fetch_add(1, std::memory_order_relaxed);
  std::string times;
  for (const auto& [name, us] : r.best_us) times += " " + name + " " + std::to_string(us) + " us";
  GRAPH_DEBUG("Choice at ", r.site, " for ", r.subject, " (", r.key, "): ", r.chosen, ", ", r.how, times.empty() ? "" : ":",
              times);
  std::lock_guard<std::mutex> lock(g_mutex);
  r.seq = ++g_seq;
  g_records.push_back(std::move(r));
  if (g_records.size() > kKeptRecords) g_records.pop_front();
}

void forget_group(int64_t group_id) {
  if (group_id < 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::erase_if(g_records, [&](const Record& r) { return r.group_id == group_id; });
}

std::vector<Record> records() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_records.begin(), g_records.end()};
}

int64_t measured_count() { return g_measured.load(std::memory_order_relaxed); }

// TORCH_LLGA_MACHINE_BUSY=0 (or 1): take the machine as quiet (or busy) whatever /proc/stat says.
std::atomic<int> g_busy_for_tests{[] {
  const char* env = std::getenv("TORCH_LLGA_MACHINE_BUSY");
  return env && (env[0] == '0' || env[0] == '1') && !env[1] ? env[0] - '0' : -1;
}()};

void set_machine_busy_for_tests(int busy) { g_busy_for_tests.store(busy, std::memory_order_relaxed); }

bool machine_busy() {
  if (int forced = g_busy_for_tests.load(std::memory_order_relaxed); forced >= 0) return forced == 1;
  static const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return false;  // not Linux's /proc: measure
  char line[256];
  long running = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "procs_running %ld", &running) == 1) break;
  std::fclose(f);
  return running > cores;
}

double now_ns() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

double thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

}  // namespace llga::choices
