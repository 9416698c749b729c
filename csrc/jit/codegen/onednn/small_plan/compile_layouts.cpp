// The small-graph plan's layouts: views (transpose, t, permute, unsqueeze, squeeze, reshape,
// eval dropout) as new layouts over their source's memory, contiguous as a dense copy where
// needed, and cat as copies into slices of its output.
#include <torch/csrc/jit/ir/constants.h>

#include <utility>

#include "jit/codegen/onednn/small_plan/compiler.h"

namespace llga {

// A view: a new layout over the source's memory.
bool Compiler::view(const Node* n, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  Layout src = layouts_.at(n->input(0));
  layouts_[n->output()] = Layout{src.ref, std::move(sizes), std::move(strides)};
  return true;
}

// A layout for the source's values as a dense tensor: the source's own if it is dense, else a
// copy in the scratch area.
std::optional<Layout> Compiler::dense(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x) return std::nullopt;
  if (is_contiguous(*x)) return *x;
  Layout copy = scratch_layout(x->sizes);
  elementwise_step(Fn::kCopy, copy, {x});
  return copy;
}

// reshape, view, flatten: the output's profiled sizes over dense memory (the guard fixed the input
// sizes, so any size list, constant or computed, gives them).
bool Compiler::reshape(const Node* n) {
  auto sizes = profiled_sizes(n->output());
  auto src = dense(n);
  if (!sizes || !src) return fail("a reshape of unknown sizes");
  if (c10::multiply_integers(*sizes) != src->numel()) return fail("a reshape that changes the number of elements");
  layouts_[n->output()] = Layout{src->ref, *sizes, contiguous_strides(*sizes)};
  return true;
}

// The source's dims in `order` (each once).
bool Compiler::permuted(const Node* n, const std::vector<int64_t>& order) {
  const Layout* x = operand(n->input(0));
  if (!x || order.size() != x->sizes.size()) return fail("a permutation of another rank");
  const int64_t r = static_cast<int64_t>(order.size());
  std::vector<int64_t> sizes, strides;
  std::vector<bool> seen(r);
  for (int64_t d : order) {
    auto at = wrap_dim(d, r);
    if (!at || seen[*at]) return fail("a permutation that is none");
    seen[*at] = true;
    sizes.push_back(x->sizes[*at]);
    strides.push_back(x->strides[*at]);
  }
  return view(n, sizes, strides);
}

bool Compiler::permute(const Node* n) {
  auto order = int_list(n->input(1));
  return order ? permuted(n, *order) : fail("permute of unknown dims");
}

bool Compiler::transpose(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x) return fail("transpose of no float tensor");
  const int64_t r = static_cast<int64_t>(x->sizes.size());
  auto d0 = wrap_dim(int_arg(n->input(1)), r), d1 = wrap_dim(int_arg(n->input(2)), r);
  if (!d0 || !d1) return fail("transpose of unknown dims");
  std::vector<int64_t> order(r);
  for (int64_t i = 0; i < r; ++i) order[i] = i;
  std::swap(order[*d0], order[*d1]);
  return permuted(n, order);
}

bool Compiler::t(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x || x->sizes.size() > 2) return fail("t() of more than 2 dims");
  if (x->sizes.size() < 2) return view(n, x->sizes, x->strides);
  return permuted(n, {1, 0});
}

bool Compiler::unsqueeze(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x) return fail("unsqueeze of no float tensor");
  const int64_t r = static_cast<int64_t>(x->sizes.size()) + 1;
  auto d = wrap_dim(int_arg(n->input(1)), r);
  if (!d) return fail("unsqueeze of an unknown dim");
  const int64_t at = *d;
  std::vector<int64_t> sizes = x->sizes, strides = x->strides;
  int64_t stride = at < r - 1 ? sizes[at] * strides[at] : 1;
  sizes.insert(sizes.begin() + at, 1);
  strides.insert(strides.begin() + at, stride);
  return view(n, sizes, strides);
}

bool Compiler::squeeze(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x) return fail("squeeze of no float tensor");
  const int64_t r = static_cast<int64_t>(x->sizes.size());
  if (r == 0) return view(n, x->sizes, x->strides);
  auto d = wrap_dim(int_arg(n->input(1)), r);
  if (!d) return fail("squeeze of an unknown dim");
  std::vector<int64_t> sizes = x->sizes, strides = x->strides;
  if (sizes[*d] == 1) {
    sizes.erase(sizes.begin() + *d);
    strides.erase(strides.begin() + *d);
  }
  return view(n, sizes, strides);
}

bool Compiler::identity(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x) return fail("an operand is no float tensor");
  return view(n, x->sizes, x->strides);
}

bool Compiler::contiguous(const Node* n) {
  auto src = dense(n);
  if (!src) return fail("an operand is no float tensor");
  layouts_[n->output()] = *src;
  return true;
}

bool Compiler::cat(const Node* n) {
  const Node* list = n->input(0)->node();
  auto dim = int_arg(n->input(1));
  if (list->kind() != c10::prim::ListConstruct || list->inputs().empty()) return fail("cat of a list the plan cannot see");
  std::vector<Layout> parts;
  for (const Value* v : list->inputs()) {
    const Layout* l = operand(v);
    if (!l) return fail("cat of a tensor that is no float tensor");
    parts.push_back(*l);
  }
  const int64_t r = static_cast<int64_t>(parts[0].sizes.size());
  auto wrapped = wrap_dim(dim, r);
  if (!wrapped) return fail("cat dim out of range");
  const int64_t d = *wrapped;
  std::vector<int64_t> sizes = parts[0].sizes;
  sizes[d] = 0;
  for (const Layout& part : parts) {
    if (static_cast<int64_t>(part.sizes.size()) != r) return fail("cat of tensors of different ranks");
    for (int64_t i = 0; i < r; ++i)
      if (i != d && part.sizes[i] != sizes[i]) return fail("cat of tensors of different sizes");
    sizes[d] += part.sizes[d];
  }
  if (!within_limits(n, sizes)) return false;
  Layout out = produce(n->output(), sizes);
  int64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {  // each part is computed or copied into its slice of the output
    const Layout& part = parts[i];
    Layout slice{{out.ref.space, out.ref.index, out.ref.offset + at * out.strides[d]}, part.sizes, out.strides};
    if (!into_cat_slice(list, list->inputs()[i], slice)) elementwise_step(Fn::kCopy, slice, {&part});
    at += part.sizes[d];
  }
  return true;
}

bool Compiler::dropout(const Node* n) {
  auto train = torch::jit::toIValue(n->input(2));
  if (!train || !train->isBool() || train->toBool()) return fail("dropout in training mode");
  return identity(n);
}

}  // namespace llga
