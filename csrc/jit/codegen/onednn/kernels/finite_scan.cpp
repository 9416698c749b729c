// The NaN and Inf scan (finite_scan.h).
#include "jit/codegen/onednn/kernels/finite_scan.h"

#include <ATen/Parallel.h>

#include <atomic>

namespace llga {

namespace {

// Any Inf or NaN (exponent all ones) among n values of this bit width? Adding one to the exponent
// of |x| carries into the sign bit exactly then; OR-ing the sums is plain integer work, which the
// compiler vectorizes in fixed-size blocks (the scan runs on every checked input of every call).
template <typename Bits>
[[gnu::always_inline]] inline bool any_nonfinite_in(const Bits* bits, int64_t n) {
  constexpr int kMantissa = sizeof(Bits) == 4 ? 23 : 7;  // fp32, bf16
  constexpr Bits kSign = Bits(1) << (sizeof(Bits) * 8 - 1);
  constexpr Bits kExpOne = Bits(1) << kMantissa;
  constexpr int64_t kBlock = 256;
  Bits acc = 0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int64_t j = 0; j < kBlock; ++j) acc |= static_cast<Bits>((bits[i + j] & ~kSign) + kExpOne);
  for (; i < n; ++i) acc |= static_cast<Bits>((bits[i] & ~kSign) + kExpOne);
  return acc & kSign;
}

}  // namespace

// Compiled for AVX-512 and AVX2 too, picked at load time: 64-byte vectors scan 4x the default's
// 16 bytes per instruction.
[[gnu::target_clones("avx512f", "avx2", "default")]] bool any_nonfinite(const uint32_t* bits, int64_t n) {
  return any_nonfinite_in(bits, n);
}
[[gnu::target_clones("avx512f", "avx2", "default")]] bool any_nonfinite(const uint16_t* bits, int64_t n) {
  return any_nonfinite_in(bits, n);
}

// Large tensors are scanned on PyTorch's intra-op threads (XML-CNN scans a 1.2 MB input per group).
template <typename Bits>
bool any_nonfinite_parallel(const Bits* bits, int64_t n) {
  constexpr int64_t kGrain = 64 * 1024;
  if (n < 2 * kGrain) return any_nonfinite(bits, n);
  std::atomic<bool> found{false};
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    if (!found.load(std::memory_order_relaxed) && any_nonfinite(bits + begin, end - begin))
      found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

template bool any_nonfinite_parallel(const uint32_t* bits, int64_t n);
template bool any_nonfinite_parallel(const uint16_t* bits, int64_t n);

}  // namespace llga
