#include "common/host_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace keel {
namespace {

constexpr size_t kMinCachedBytes = size_t{1} << 20;
constexpr size_t kAlignment = 64;  // LibTorch's CPU alignment (c10::gAlignment)
constexpr size_t kMinClassStep = size_t{64} << 10;

// Transparent huge pages (madvise) were tried for these blocks: no faster step on the medium
// bench config, and 3 s more system time per run spent compacting memory, so plain pages.
void* system_allocate(size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, kAlignment, bytes) == 0 ? p : nullptr;
}

class CachingHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* p = bytes < kMinCachedBytes ? c10::alloc_cpu(bytes) : acquire(bytes);
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void set_limit(size_t max_cached_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    max_cached_bytes_ = max_cached_bytes;
  }

  void empty_cache() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [size, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
      free_.clear();
      stats_.cached_bytes = 0;
    }
    for (void* p : blocks) std::free(p);
  }

  HostAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }

  static CachingHostAllocator& instance() {
    static auto* allocator =
        new CachingHostAllocator();  // never destroyed: tensors may outlive statics
    return *allocator;
  }

 private:
  void* acquire(size_t bytes) {
    const size_t size = host_allocation_size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= static_cast<int64_t>(size);
        note_in_use(p, size, /*hit=*/true);
        return p;
      }
    }
    void* p = system_allocate(size);
    if (p == nullptr) {  // the cache may hold what the system lacks
      empty_cache();
      p = system_allocate(size);
    }
    TORCH_CHECK(p != nullptr, "keel host allocator: out of memory allocating ", bytes, " bytes");
    std::lock_guard<std::mutex> lock(mu_);
    note_in_use(p, size, /*hit=*/false);
    return p;
  }

  void note_in_use(void* p, size_t size, bool hit) {  // mu_ held
    in_use_.emplace(p, size);
    stats_.in_use_bytes += static_cast<int64_t>(size);
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    ++(hit ? stats_.hits : stats_.misses);
  }

  static void release(void* p) {
    if (p == nullptr) return;
    if (!instance().recycle(p)) c10::free_cpu(p);
  }

  // False when p is not one of the large blocks (a small one, from c10::alloc_cpu).
  bool recycle(void* p) {
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_use_.find(p);
      if (it == in_use_.end()) return false;
      size = it->second;
      in_use_.erase(it);
      stats_.in_use_bytes -= static_cast<int64_t>(size);
      if (static_cast<size_t>(stats_.cached_bytes) + size <= max_cached_bytes_) {
        free_[size].push_back(p);
        stats_.cached_bytes += static_cast<int64_t>(size);
        return true;
      }
    }
    std::free(p);
    return true;
  }

  std::mutex mu_;
  size_t max_cached_bytes_ = 0;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> free blocks
  std::unordered_map<void*, size_t> in_use_;             // large block -> its size class
  HostAllocatorStats stats_;
};

}  // namespace

size_t host_allocation_size_class(size_t bytes) {
  const size_t step = std::max(std::bit_floor(bytes) / 16, kMinClassStep);
  return (bytes + step - 1) / step * step;
}

void install_caching_host_allocator(size_t max_cached_bytes) {
  auto& allocator = CachingHostAllocator::instance();
  allocator.set_limit(max_cached_bytes);
  // Above the default allocator's priority 0, so that a later default registration cannot win.
  c10::SetCPUAllocator(&allocator, /*priority=*/1);
  TORCH_CHECK(c10::GetCPUAllocator() == &allocator,
              "keel host allocator: LibTorch kept another CPU allocator of higher priority");
}

void restore_default_host_allocator() {
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), /*priority=*/1);
  CachingHostAllocator::instance().set_limit(0);
  empty_host_cache();
}

bool caching_host_allocator_installed() {
  return c10::GetCPUAllocator() == &CachingHostAllocator::instance();
}

size_t default_host_cache_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  size_t limit = pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * page_size / 4 : 0;
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) {
    const long ranks = std::strtol(local, nullptr, 10);
    if (ranks > 1) limit /= static_cast<size_t>(ranks);
  }
  return limit;
}

void empty_host_cache() { CachingHostAllocator::instance().empty_cache(); }

HostAllocatorStats host_allocator_stats() { return CachingHostAllocator::instance().stats(); }

void reset_host_peak_in_use() { CachingHostAllocator::instance().reset_peak(); }

}  // namespace keel
