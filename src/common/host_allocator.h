// A caching allocator for LibTorch's CPU tensors.
//
// LibTorch's default CPU allocator hands every tensor to malloc and back. A training step
// allocates and frees the same large activation and gradient buffers every step; glibc serves
// buffers above its mmap threshold (at most 32 MiB) with fresh mmaps and trims freed heap tops,
// so each step faults those pages in again and the kernel zeroes them. On the 2-core
// development VM that was 15 % of a step's CPU time, most of it inside elementwise kernels that
// are the first to touch their output. Like the CUDA caching allocator, this one keeps freed
// large blocks and hands them back for the next request of the same size class.
#pragma once

#include <cstddef>
#include <cstdint>

namespace keel {

struct HostAllocatorStats {
  int64_t hits = 0;               // large allocations served from the cache
  int64_t misses = 0;             // large allocations that went to the system
  int64_t cached_bytes = 0;       // free blocks held now
  int64_t in_use_bytes = 0;       // large blocks handed out and not yet freed
  int64_t peak_in_use_bytes = 0;  // the most in_use_bytes reached since the last reset
};

// Makes the caching allocator LibTorch's CPU allocator for the rest of the process. Requests
// below 1 MiB still go to the system allocator (malloc reuses those without faulting). At most
// max_cached_bytes of free blocks are kept; beyond that a freed block goes back to the system.
// Calling it again only updates the limit. Tensors allocated before keep their own deleter.
void install_caching_host_allocator(size_t max_cached_bytes);

// Puts LibTorch's default CPU allocator back (run.host_allocator: system); cached blocks are
// freed, blocks in use are still recycled or freed by their own deleter.
void restore_default_host_allocator();
// True while the caching allocator is LibTorch's CPU allocator.
bool caching_host_allocator_installed();

// A quarter of physical memory, shared by the ranks on this host (LOCAL_WORLD_SIZE, as torchrun
// and keel launch set it).
size_t default_host_cache_limit();

// Frees every cached block; blocks in use are unaffected.
void empty_host_cache();

HostAllocatorStats host_allocator_stats();
// Starts a new peak from what is in use now (the memory a stretch of work needed on top).
void reset_host_peak_in_use();

// The size class a large request is rounded up to (exposed for tests): steps of 1/16 of the
// next lower power of two, at least 64 KiB, so rounding wastes at most 6.25 %.
size_t host_allocation_size_class(size_t bytes);

}  // namespace keel
