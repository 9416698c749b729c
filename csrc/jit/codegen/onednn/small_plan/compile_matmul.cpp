// The small-graph plan's matmul steps: matmul, linear (over its weight's transpose) and addmm
// (its bias added by the step).
#include <algorithm>

#include "jit/codegen/onednn/small_plan/compiler.h"

namespace llga {

// out = a @ b (+ bias), a: [..., m, k] (leading dims folded into m, or a batch matching b's),
// b: [k, n] or [batch, k, n].
bool Compiler::matmul_op(const Node* n, const Layout& a, const Layout& b, const Layout* bias) {
  const size_t ra = a.sizes.size(), rb = b.sizes.size();
  if (ra < 2 || rb < 2 || rb > 3 || (rb == 3 && ra != 3)) return fail("a matmul of ranks the plan has no step for");
  Step s;
  s.kind = Step::kMatMul;
  s.round_bf16 = p_.bf16;
  s.k = a.sizes[ra - 1];
  if (b.sizes[rb - 2] != s.k) return fail("matmul operands that do not match");
  s.n = b.sizes[rb - 1];
  std::vector<int64_t> out_sizes(a.sizes.begin(), a.sizes.end() - 1);
  out_sizes.push_back(s.n);
  if (rb == 3) {
    if (a.sizes[0] != b.sizes[0]) return fail("a batched matmul that broadcasts");
    s.batch = a.sizes[0];
    s.m = a.sizes[1];
    s.as[0] = a.strides[0], s.bs[0] = b.strides[0];
    s.as[1] = a.strides[1];
  } else {
    // The leading dims folded into m rows at one stride: walked from the inside out, size-1
    // dims skipped (their strides are arbitrary: unsqueeze, permute), each other dim must step
    // as one with those inside it.
    s.m = 1;
    s.as[1] = a.strides[ra - 2];
    int64_t expected = -1;  // the stride the next dim of size > 1 must have
    for (size_t d = ra - 1; d-- > 0;) {
      s.m *= a.sizes[d];
      if (a.sizes[d] == 1) continue;
      if (expected < 0)
        s.as[1] = a.strides[d];
      else if (a.strides[d] != expected)
        return fail("a matmul over strided rows");
      expected = a.strides[d] * a.sizes[d];
    }
  }
  s.as[2] = a.strides[ra - 1];
  s.bs[1] = b.strides[rb - 2], s.bs[2] = b.strides[rb - 1];
  if (!within_limits(n, out_sizes)) return false;
  macs_ += s.batch * s.m * s.n * s.k;
  rows_ = std::max(rows_, s.batch * s.m);
  Layout out = produce(n->output(), out_sizes);
  s.os[0] = s.m * s.n, s.os[1] = s.n, s.os[2] = 1;
  if (bias) {
    auto sizes = broadcast(bias->sizes, {s.m, s.n});
    if (bias->sizes.size() > 2 || !sizes || *sizes != std::vector<int64_t>{s.m, s.n}) return fail("a bias that does not broadcast");
    size_t r = bias->sizes.size();
    s.bias_s[0] = r == 2 && bias->sizes[0] != 1 ? bias->strides[0] : 0;
    s.bias_s[1] = r >= 1 && bias->sizes[r - 1] != 1 ? bias->strides[r - 1] : 0;
    s.bias = bias->ref;
    s.has_bias = true;
  }
  s.out = out.ref, s.a = a.ref, s.b = b.ref;
  p_.steps.push_back(s);
  return true;
}

bool Compiler::matmul(const Node* n) {
  const Layout* x = operand(n->input(0));
  const Layout* y = operand(n->input(1));
  if (!x || !y) return fail("a matmul operand is no float tensor");
  return matmul_op(n, *x, *y, nullptr);
}

bool Compiler::linear(const Node* n) {
  const Layout* x = operand(n->input(0));
  if (!x) return fail("a linear operand is no float tensor");
  const Layout* w = operand(n->input(1));
  if (!w || w->sizes.size() != 2) return fail("a linear weight that is no matrix");
  Layout wt{w->ref, {w->sizes[1], w->sizes[0]}, {w->strides[1], w->strides[0]}};  // weight.t()
  const Layout* bias = nullptr;
  if (n->input(2)->type()->kind() != c10::TypeKind::NoneType && !(bias = operand(n->input(2))))
    return fail("a linear bias that is no float tensor");
  return matmul_op(n, *x, wt, bias);
}

bool Compiler::addmm(const Node* n) {
  auto beta = number(n->input(3)), alpha = number(n->input(4));
  if (!beta || !alpha || *beta != 1 || *alpha != 1) return fail("addmm with beta or alpha other than 1");
  const Layout* bias = operand(n->input(0));
  const Layout* x = operand(n->input(1));
  const Layout* y = operand(n->input(2));
  if (!bias || !x || !y || x->sizes.size() != 2 || y->sizes.size() != 2) return fail("addmm operands that are no float matrices");
  return matmul_op(n, *x, *y, bias);
}

}  // namespace llga
