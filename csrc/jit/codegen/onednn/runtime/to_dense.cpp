// llga_to_dense: a one-op Reorder partition from an LLGA tensor's layout to contiguous, compiled
// once per (dtype, sizes, source layout) and kept in a small process-wide cache. Building,
// partitioning and compiling a one-op graph costs far more than the reorder itself, and a guard's
// fallback or a speed check converts the same layouts call after call.
#include "jit/codegen/onednn/runtime/to_dense.h"

#include <ATen/ATen.h>

#include <mutex>

#include "aten/LlgaTensorImpl/LlgaTensorImpl.h"
#include "jit/codegen/onednn/mapping/dtypes.h"
#include "jit/codegen/onednn/runtime/compile_cache.h"
#include "jit/codegen/onednn/runtime/runtime.h"

namespace llga {

namespace {

using dnnl::graph::logical_tensor;

struct Reorder {
  logical_tensor in, out;
  dnnl::graph::compiled_partition partition;
  std::mutex execute_mutex;  // a compiled partition must not execute on two threads at once
};

// Layouts are few (one per opaque layout a group chose, or per strided one): 64 is plenty, and
// bounds what a process of changing shapes keeps.
constexpr int64_t kCapacity = 64;

CompileCache<Reorder>& reorders() {
  static auto* cache = new CompileCache<Reorder>();  // never destroyed: a thread may convert at exit
  return *cache;
}

std::shared_ptr<Reorder> compile_reorder(const logical_tensor& src, const std::vector<int64_t>& dense_strides) {
  auto r = std::make_shared<Reorder>();
  const auto dims = src.get_dims();
  r->in = src.get_layout_type() == logical_tensor::layout_type::opaque
              ? logical_tensor(0, src.get_data_type(), dims, src.get_layout_id())
              : logical_tensor(0, src.get_data_type(), dims, src.get_strides());
  r->out = logical_tensor(1, src.get_data_type(), dims, dense_strides);
  dnnl::graph::op reorder(0, dnnl::graph::op::kind::Reorder, {r->in}, {r->out}, "to_dense");
  dnnl::graph::graph g(dnnl::engine::kind::cpu);
  g.add_op(reorder);
  g.finalize();
  auto parts = g.get_partitions();
  TORCH_CHECK(parts.size() == 1 && parts[0].is_supported(), "torch_llga: cannot reorder an LLGA tensor to strided");
  r->partition = parts[0].compile({r->in}, {r->out}, runtime::engine());
  runtime::stats().to_dense_compilations.fetch_add(1, std::memory_order_relaxed);
  return r;
}

// One reorder of src's memory into out's (a compiled partition runs on one thread at a time).
void execute(Reorder& r, void* src, void* out) {
  dnnl::graph::tensor in(r.in, runtime::engine(), src);
  dnnl::graph::tensor o(r.out, runtime::engine(), out);
  std::lock_guard<std::mutex> lock(r.execute_mutex);
  r.partition.execute(runtime::stream(), {in}, {o});
}

}  // namespace

at::Tensor llga_to_dense(const at::Tensor& t) {
  if (!is_llga_tensor(t)) return t;
  const auto& impl = llga_impl(t);
  const auto& src = impl.desc();
  const auto dims = src.get_dims();
  at::Tensor out = at::empty(dims, at::TensorOptions().dtype(t.scalar_type()));
  if (out.numel() == 0) return out;
  CompileCache<Reorder>::Key key;
  key.push_back(static_cast<int64_t>(src.get_data_type()));
  const bool opaque = src.get_layout_type() == logical_tensor::layout_type::opaque;
  key.push_back(opaque ? static_cast<int64_t>(src.get_layout_id()) : -1);
  key.push_back(static_cast<int64_t>(dims.size()));
  for (auto s : dims) key.push_back(s);
  for (auto s : impl.layout_strides()) key.push_back(s);  // empty if opaque
  auto r = reorders().get(key, kCapacity, [&] { return compile_reorder(src, out.strides().vec()); });
  execute(*r, impl.data(), out.data_ptr());
  return out;
}

at::Tensor strided_copy(const at::Tensor& t, c10::IntArrayRef strides) {
  auto dtype = to_dnnl_dtype(t.scalar_type());
  TORCH_CHECK(dtype && !is_llga_tensor(t), "torch_llga: strided_copy of an unsupported tensor");
  at::Tensor out = at::empty_strided(t.sizes(), strides, t.options());
  if (out.numel() == 0) return out;
  CompileCache<Reorder>::Key key;
  key.push_back(-3);  // a strided source (llga_to_dense's keys start with a data type)
  key.push_back(static_cast<int64_t>(*dtype));
  key.push_back(t.dim());
  for (auto s : t.sizes()) key.push_back(s);
  for (auto s : t.strides()) key.push_back(s);
  for (auto s : strides) key.push_back(s);
  auto r = reorders().get(key, kCapacity, [&] {
    return compile_reorder(logical_tensor(0, *dtype, t.sizes().vec(), t.strides().vec()), strides.vec());
  });
  execute(*r, const_cast<void*>(t.const_data_ptr()), out.data_ptr());
  return out;
}

}  // namespace llga
