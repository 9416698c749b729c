// llga::SpeedChoice and llga::SpeedChoiceEnd (passes/speed_choices.cpp): which of a group's two
// forms runs (choice site "speed_rule": the op a speed rule keeps out in PyTorch, its default, or
// fused by oneDNN), by timing both at each set of input sizes a call brings. A form's first calls
// compile its groups and run their own checks (speed_check.cpp), so each form first runs a few
// calls untimed; then the forms alternate, and the faster one's best time wins. The loser's
// compiled partitions (and oneDNN's reordered weights with them) are released.
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <ATen/Tensor.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "jit/codegen/onednn/mapping/llga_nodes.h"
#include "jit/codegen/onednn/runtime/kernel_registry.h"
#include "jit/codegen/onednn/settings/choices.h"

namespace llga {

namespace {

using torch::jit::Node;
using torch::jit::Stack;

constexpr int kUntimedCalls = 5;  // per form: a group's compilation and its checks (4 calls) run untimed
constexpr int kTimedCalls = 3;    // per form, alternating
constexpr size_t kMaxKeys = 16;   // sizes measured; others run the default

const choices::Site& speed_rule_site() {
  static const choices::Site& s = choices::site("speed_rule");
  return s;
}

const Node* first_group(const torch::jit::Block* b) {
  for (const Node* n : b->nodes()) {
    if (n->kind() == kFusionGroup) return n;
    for (const auto* inner : n->blocks())
      if (const Node* g = first_group(inner)) return g;
  }
  return nullptr;
}

class SpeedChoice : public std::enable_shared_from_this<SpeedChoice> {
 public:
  explicit SpeedChoice(const Node* node) : id_(node->i(kChoiceId)), inputs_(node->inputs().size()) {
    rules_ = node->s(kSpeedRules);
    const Node* branch = node->output()->uses().size() == 1 ? node->output()->uses()[0].user : nullptr;
    if (branch && branch->kind() == c10::prim::If) {
      for (size_t form = 0; form < 2; ++form) collect_group_ids(branch->blocks()[form], groups_[form]);
      if (const Node* group = first_group(branch->blocks()[0])) subject_ = fusion_group_name(*group->g(c10::attr::Subgraph));
    }
    subject_ += " against " + rules_;
  }

  ~SpeedChoice() { choices::forget_group(id_); }  // its records go with it (choices.h)

  // The form this call runs: 0 the fused group, 1 the rule's (the If's condition: form 0).
  int begin(Stack& stack);
  void end(int form, size_t slot, double ns);

 private:
  struct AtKey {
    choices::Key key{};
    std::string described;
    int calls = 0, busy = 0;
    int timed[2] = {0, 0};
    double best[2] = {1e300, 1e300};
    int decided = -1;
  };
  void decide(AtKey& k, int form, const char* how);
  int run(int form);

  const int64_t id_;
  const size_t inputs_;
  std::string rules_, subject_ = "llga::FusionGroup";
  std::unordered_set<int64_t> groups_[2];
  bool released_[2] = {false, false};
  std::mutex mutex_;
  std::vector<AtKey> keys_;  // few: one per set of input sizes
};

// A call being timed on this thread: its choice, its key's slot, its form, when it began.
struct Open {
  std::weak_ptr<SpeedChoice> choice;
  int64_t id;
  size_t slot;
  int form;
  double start;
};
thread_local std::vector<Open> open_calls;

int SpeedChoice::begin(Stack& stack) {
  // A new call of this choice on this thread: an entry of an earlier one left open (its block
  // threw) is stale.
  while (!open_calls.empty() && open_calls.back().id == id_) open_calls.pop_back();
  // Keyed by the inputs' ranks, dims in power-of-two buckets (a prompt's length varies call by
  // call: measured once a bucket) and dtypes.
  choices::Key key{};
  size_t filled = 0;
  for (size_t i = stack.size() - inputs_; i < stack.size(); ++i) {
    const at::Tensor& t = stack[i].toTensor();
    if (filled + 1 < key.size()) key[filled++] = -t.dim();
    for (int64_t d : t.sizes())
      if (filled + 1 < key.size()) key[filled++] = choices::bucket(d);
    key.back() = key.back() * 31 + static_cast<int64_t>(t.scalar_type()) + 1;
  }
  auto pin = choices::pinned(speed_rule_site());
  std::unique_lock<std::mutex> lock(mutex_);
  size_t slot = 0;
  while (slot < keys_.size() && keys_[slot].key != key) ++slot;
  if (slot == keys_.size()) {
    if (keys_.size() >= kMaxKeys) {  // sizes that rarely repeat: the default, untimed
      torch::jit::drop(stack, inputs_);
      return run(1);
    }
    keys_.emplace_back();
    keys_.back().key = key;
    for (size_t i = stack.size() - inputs_; i < stack.size(); ++i) {
      const at::Tensor& t = stack[i].toTensor();
      keys_.back().described += (keys_.back().described.empty() ? "" : ", ") + c10::str(t.sizes(), " ", t.scalar_type());
    }
  }
  AtKey& k = keys_[slot];
  torch::jit::drop(stack, inputs_);
  if (k.decided >= 0) return run(k.decided);
  if (pin) {
    decide(k, *pin == 1 ? 0 : 1, "pinned");
    return run(k.decided);
  }
  // The rule's form (the default) first, then the fused one, untimed; then in turn, timed.
  const int call = k.calls++;
  if (call < 2 * kUntimedCalls) return run(call < kUntimedCalls ? 1 : 0);
  if (choices::machine_busy()) {  // no timing beside other work: the default (the rule's form)
    if (++k.busy >= choices::kBusyTries) decide(k, 1, "kept: machine busy");
    return run(1);
  }
  const int form = run(call % 2);
  lock.unlock();
  open_calls.push_back({weak_from_this(), id_, slot, form, choices::now_ns()});
  return form;
}

// Under mutex_: a form about to run (again): its partitions are no longer released.
int SpeedChoice::run(int form) {
  released_[form] = false;
  return form;
}

void SpeedChoice::end(int form, size_t slot, double ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  AtKey& k = keys_[slot];
  if (k.decided >= 0) return;
  k.best[form] = std::min(k.best[form], ns);
  ++k.timed[form];
  if (k.timed[0] < kTimedCalls || k.timed[1] < kTimedCalls) return;
  const choices::Site& site = speed_rule_site();
  decide(k, k.best[0] * site.margin + site.margin_ns < k.best[1] ? 0 : 1, "measured");
}

// Under mutex_.
void SpeedChoice::decide(AtKey& k, int form, const char* how) {
  k.decided = form;
  const choices::Site& site = speed_rule_site();
  std::vector<std::pair<std::string, double>> times;
  if (k.timed[0] && k.timed[1]) times = {{"pytorch", k.best[1] / 1e3}, {"onednn", k.best[0] / 1e3}};
  choices::record({"speed_rule", subject_, k.described, form == 0 ? "onednn" : "pytorch", how, std::move(times), id_,
                   site.margin, site.margin_ns});
  // A form no size chose goes (its compiled partitions, oneDNN's reordered weights), once every
  // size is decided: one still measured would recompile it into its timing.
  for (const AtKey& other : keys_)
    if (other.decided < 0) return;
  for (int f = 0; f < 2; ++f) {
    bool wanted = false;
    for (const AtKey& other : keys_) wanted = wanted || other.decided == f;
    if (!wanted && !released_[f]) {
      released_[f] = true;
      release_groups(groups_[f]);
    }
  }
}

torch::jit::RegisterOperators registered({
    torch::jit::Operator(
        kSpeedChoice,
        [](const Node* node) -> torch::jit::Operation {
          auto choice = std::make_shared<SpeedChoice>(node);
          return [choice](Stack& stack) { stack.emplace_back(choice->begin(stack) == 0); };
        },
        // It reads its inputs' sizes only (conservative would have them written: nothing fuses).
        c10::AliasAnalysisKind::PURE_FUNCTION),
    torch::jit::Operator(
        kSpeedChoiceEnd,
        [](const Node* node) -> torch::jit::Operation {
          const int64_t id = node->i(kChoiceId);
          return [id](Stack&) {
            // Only a timed call of this choice left an entry, on top (another choice's call in
            // its block, a group's fallback optimized on its own, has ended by now).
            if (open_calls.empty() || open_calls.back().id != id) return;
            Open call = open_calls.back();
            open_calls.pop_back();
            if (auto choice = call.choice.lock()) choice->end(call.form, call.slot, choices::now_ns() - call.start);
          };
        },
        c10::AliasAnalysisKind::CONSERVATIVE),  // no inputs to write; side effects keep it
});

}  // namespace

}  // namespace llga
