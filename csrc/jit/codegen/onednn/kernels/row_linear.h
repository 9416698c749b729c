#pragma once
// llga::row_linear(x, weight, bias): x @ weight^T + bias for one to four rows of x (a decoder's step:
// one token a sequence) over a large fp32 weight, at the machine's memory bandwidth (row_linear.cpp
// says by how much oneDNN's and MKL's one-row kernels fall short), and
// llga::rms_norm_row_linear(x, norm_weight, eps, weight, bias): the same after an RMSNorm of x's
// rows that only the linear reads (a decoder's norms before its q/k/v, MLP and LM head). The
// RowLinears pass gives them such linears; a call with more rows, or anything else the kernel does
// not take, runs at::linear (after at::rms_norm).
#include <ATen/core/symbol.h>

#include <cstdint>

namespace llga {

inline const c10::Symbol kRowLinear = c10::Symbol::fromQualString("llga::row_linear");
inline const c10::Symbol kRmsNormRowLinear = c10::Symbol::fromQualString("llga::rms_norm_row_linear");

// Up to 4 rows, all read against each weight row as it streams by (beyond that a gemm's blocking
// pays: oneDNN's kernels). From 64K weights (256 KB) on, the weight's stream is the time: below
// that a group's post-ops and a fused neighbour are worth more.
constexpr int64_t kRowLinearMaxRows = 4;
constexpr int64_t kRowLinearMinWeights = 64 * 1024;

// Whether the kernel runs a linear of this many rows and this [out, in] weight on this CPU.
bool row_linear_runs(int64_t rows, int64_t out_features, int64_t in_features);

}  // namespace llga
