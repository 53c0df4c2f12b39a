#include "common/host_allocator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

namespace keel {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(HostAllocator, SizeClassesWasteAtMostOneSixteenth) {
  EXPECT_EQ(host_allocation_size_class(kMiB), static_cast<size_t>(kMiB));
  size_t previous = 0;
  for (size_t bytes = kMiB; bytes < 512 * kMiB; bytes = bytes * 9 / 8 + 4093) {
    const size_t size = host_allocation_size_class(bytes);
    EXPECT_GE(size, bytes);
    EXPECT_LE(size - bytes, bytes / 16) << bytes;
    EXPECT_EQ(size % (64 << 10), 0u) << bytes;
    EXPECT_GE(size, previous);
    previous = size;
  }
}

TEST(HostAllocator, AFreedLargeBlockServesTheNextRequestOfItsClass) {
  install_caching_host_allocator(/*max_cached_bytes=*/256 * kMiB);
  const auto before = host_allocator_stats();
  void* first = nullptr;
  {
    auto t = torch::empty({3 * kMiB}, torch::kFloat);  // 12 MiB
    first = t.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u) << "LibTorch's alignment";
    EXPECT_GE(host_allocator_stats().in_use_bytes - before.in_use_bytes, 12 * kMiB);
  }
  EXPECT_GE(host_allocator_stats().cached_bytes, 12 * kMiB);
  auto again = torch::empty({3 * kMiB - 7}, torch::kFloat);  // same size class
  EXPECT_EQ(again.data_ptr(), first);
  const auto after = host_allocator_stats();
  EXPECT_EQ(after.hits - before.hits, 1);
  EXPECT_EQ(after.misses - before.misses, 1);

  // Small requests stay with malloc and never enter the cache.
  {
    auto small = torch::ones({1000}, torch::kFloat);
    EXPECT_EQ(small.sum().item<float>(), 1000.0f);
  }
  EXPECT_EQ(host_allocator_stats().misses, after.misses);
}

TEST(HostAllocator, KeepsNoMoreThanItsLimit) {
  install_caching_host_allocator(/*max_cached_bytes=*/5 * kMiB);
  empty_host_cache();
  {
    auto a = torch::empty({kMiB}, torch::kFloat);  // 4 MiB each
    auto b = torch::empty({kMiB}, torch::kFloat);
  }
  EXPECT_EQ(host_allocator_stats().cached_bytes, 4 * kMiB)
      << "the second block went back to the system";
  empty_host_cache();
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
}

TEST(HostAllocator, TensorsOutliveAChangeOfAllocator) {
  auto from_default = torch::full({2 * kMiB}, 1.5f);  // allocated by LibTorch's default
  install_caching_host_allocator(64 * kMiB);
  auto from_cache = torch::full({2 * kMiB}, 2.5f);
  restore_default_host_allocator();
  const auto misses = host_allocator_stats().misses;
  auto after_restore = torch::full({2 * kMiB}, 0.5f);
  EXPECT_EQ(host_allocator_stats().misses, misses) << "the default allocator serves again";
  EXPECT_DOUBLE_EQ((from_default + from_cache + after_restore).sum().item<double>(),
                   4.5 * 2 * kMiB);
  from_cache.reset();  // freed by the caching allocator's deleter, now with a zero limit
  EXPECT_EQ(host_allocator_stats().cached_bytes, 0);
}

}  // namespace
}  // namespace keel
