#pragma once
// Process-wide oneDNN objects and settings shared by the passes and the kernel.
#include <oneapi/dnnl/dnnl_graph.hpp>

namespace llga::runtime {

dnnl::engine& engine();
dnnl::stream& stream();  // one per thread: oneDNN streams are not meant to be shared across threads

// The fuser switch, read by the pass on every graph it optimizes.
bool enabled();
void set_enabled(bool on);

// Debug/test knob: also make groups of single cheap ops (a lone relu), normally left to PyTorch.
bool fuse_single_ops();
void set_fuse_single_ops(bool on);

}  // namespace llga::runtime
