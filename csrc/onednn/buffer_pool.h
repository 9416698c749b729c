#pragma once
// The allocator of oneDNN's buffers, which also holds the memory of LLGA tensors: buffers of 1 KiB
// and more are kept when freed, for the next request of their size (buffer_pool.cpp says why).
// Below the fuser: the LLGA tensor allocates from it, the runtime hands it to oneDNN's engine.
#include <cstddef>
#include <cstdint>
#include <string>

namespace llga::onednn {

void* allocate_buffer(size_t size, size_t alignment);
void free_buffer(void* p);
// The most it keeps, in bytes (256 MB, or TORCH_LLGA_BUFFER_POOL_MB); setting it frees what is over.
int64_t buffer_pool_limit();
void set_buffer_pool_limit(int64_t bytes);
std::string buffer_pool_env_error();  // an unreadable TORCH_LLGA_BUFFER_POOL_MB (the default is used), or ""
// Freed buffers kept for reuse now, in bytes (torch_llga.stats()["kept_buffer_bytes"]).
int64_t kept_buffer_bytes();
// Gives every kept buffer back to the system (flush_constant_cache, release()).
void trim_buffer_pool();

}  // namespace llga::onednn
