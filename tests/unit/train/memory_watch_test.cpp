// The memory watch: once due, it records the plan and the measured peak (on the CPU, the caching
// host allocator's, recorded but not judged: it leaves out blocks under 1 MiB).
#include "train/memory_watch.h"

#include <gtest/gtest.h>

#include "common/host_allocator.h"

namespace keel::train {
namespace {

TEST(MemoryWatch, RecordsThePeakSinceItStartedOnceDue) {
  install_caching_host_allocator(size_t{1} << 30);
  auto keep = torch::ones({4 << 20});  // 16 MiB in use before the watch starts
  model::MemoryPlan plan;
  plan.weights = 16.0 * (1 << 20);
  plan.activations = 100.0 * (1 << 20);
  MemoryWatch watch(plan, torch::kCPU);
  EXPECT_FALSE(watch.due(1));
  EXPECT_TRUE(watch.due(kMemoryCheckAttempts));
  {
    auto step = torch::ones({25 << 20});  // 100 MiB more for a while
  }
  distributed::SingleProcess comm;
  const auto detail = watch.record(comm);
  EXPECT_FALSE(watch.due(kMemoryCheckAttempts + 1));  // once per start
  EXPECT_EQ(detail["measured_by"], "host_allocator_1mib_blocks");
  EXPECT_DOUBLE_EQ(detail["plan"]["total"].get<double>(), 116.0 * (1 << 20));
  EXPECT_GE(detail["peak_bytes"].get<double>(), 116.0 * (1 << 20));
  EXPECT_NEAR(detail["peak_over_plan"].get<double>(), 1.0, 0.02);
  EXPECT_FALSE(detail["judged"].get<bool>());  // small tensors are not in the CPU's figure
  restore_default_host_allocator();
}

TEST(MemoryWatch, NothingMeasuredWithTheSystemAllocator) {
  restore_default_host_allocator();
  MemoryWatch watch(model::MemoryPlan(), torch::kCPU);
  distributed::SingleProcess comm;
  const auto detail = watch.record(comm);
  EXPECT_EQ(detail["measured_by"], "none");
  EXPECT_FALSE(detail.contains("peak_bytes"));
}

}  // namespace
}  // namespace keel::train
