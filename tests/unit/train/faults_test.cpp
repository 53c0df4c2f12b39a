// The rehearsable accidents that change data or gradients: repeat_data brings one micro-batch back
// on a schedule; grad_growth ramps the fp16 gradients geometrically.
#include "train/faults.h"

#include <gtest/gtest.h>

#include <cmath>

namespace keel::train {
namespace {

config::FaultSpec fault(config::FaultKind kind, int64_t at, int64_t steps) {
  config::FaultSpec f;
  f.kind = kind;
  f.at_step = at;
  f.steps = steps;
  return f;
}

// faults[].rank and faults[].host narrow a fault down together; each left unset spares nobody.
TEST(FaultsForRank, ARankAndAHostEachNarrowTheFaultsDown) {
  auto any = fault(config::FaultKind::kNanGrad, 1, 1);
  auto rank1 = any, on_b = any, rank1_on_b = any;
  rank1.rank = 1;
  on_b.host = "b";
  rank1_on_b.rank = 1;
  rank1_on_b.host = "b";
  const std::vector<config::FaultSpec> all{any, rank1, on_b, rank1_on_b};
  EXPECT_EQ(faults_for_rank(all, 0, "a"), (std::vector<config::FaultSpec>{any}));
  EXPECT_EQ(faults_for_rank(all, 1, "a"), (std::vector<config::FaultSpec>{any, rank1}));
  EXPECT_EQ(faults_for_rank(all, 0, "b"), (std::vector<config::FaultSpec>{any, on_b}));
  EXPECT_EQ(faults_for_rank(all, 1, "b"), all);
}

data::Batch batch_at(int64_t position) {
  data::Batch b;
  b.tokens = torch::full({2, 5}, position, torch::kInt64);
  b.sample_ids = torch::tensor({2 * position, 2 * position + 1}, torch::kInt64);
  return b;
}

TEST(FaultInjector, RepeatDataBringsTheFirstMicroBatchBackEveryPeriod) {
  auto f = fault(config::FaultKind::kRepeatData, 10, 20);
  f.period = 5;
  FaultInjector faults({f}, /*grad_accum_steps=*/2, /*vocab_size=*/64, /*seed=*/1);
  // Micro-batch positions: step s has positions 2s and 2s + 1.
  for (int64_t position = 0; position < 70; ++position) {
    data::Batch b = batch_at(position);
    const bool changed = faults.corrupt(b, position);
    const int64_t step = position / 2;
    const bool repeat = position % 2 == 0 && step > 10 && step < 30 && (step - 10) % 5 == 0;
    EXPECT_EQ(changed, repeat) << position;
    // A repeat holds step 10's first micro-batch (position 20), under its own ids.
    EXPECT_EQ(b.tokens[0][0].item<int64_t>(), repeat ? 20 : position) << position;
    EXPECT_EQ(b.sample_ids[0].item<int64_t>(), 2 * position);
  }
}

TEST(FaultInjector, GradGrowthRampsToItsFactorOverTheRegion) {
  auto f = fault(config::FaultKind::kGradGrowth, 10, 4);
  f.factor = 16;
  FaultInjector faults({f}, 1, 64, 1);
  EXPECT_DOUBLE_EQ(faults.gradient_growth(9), 1.0);
  EXPECT_NEAR(faults.gradient_growth(10), 2.0, 1e-12);  // 16^(1/4)
  EXPECT_NEAR(faults.gradient_growth(13), 16.0, 1e-12);
  EXPECT_DOUBLE_EQ(faults.gradient_growth(14), 1.0);  // over: back to the real gradients
}

// corrupt_grad strikes its iterations once: a replay of the step computes it right, unless the
// fault is persistent (the device is wrong every time). Its factor defaults to one far past any
// alarm. A nan_grad comes back in a replay (the step's own values make it); nothing else does.
TEST(FaultInjector, CorruptGradStrikesOnceUnlessPersistent) {
  auto once = fault(config::FaultKind::kCorruptGrad, 10, 2);
  auto always = fault(config::FaultKind::kCorruptGrad, 20, 1);
  always.persistent = true;
  always.factor = -3.0;
  FaultInjector faults({once, always}, 1, 64, 1);
  EXPECT_EQ(faults.gradient_corruption(9, false), 1.0);
  EXPECT_EQ(faults.gradient_corruption(10, false), config::kCorruptGradFactor);
  EXPECT_EQ(faults.gradient_corruption(11, false), config::kCorruptGradFactor);
  EXPECT_EQ(faults.gradient_corruption(11, /*replay=*/true), 1.0);
  EXPECT_EQ(faults.gradient_corruption(12, false), 1.0);
  EXPECT_EQ(faults.gradient_corruption(20, false), -3.0);
  EXPECT_EQ(faults.gradient_corruption(20, /*replay=*/true), -3.0);

  auto nan = fault(config::FaultKind::kNanGrad, 5, 1);
  FaultInjector nan_faults({nan}, 1, 64, 1);
  auto p = torch::zeros({3}, torch::requires_grad());
  p.mutable_grad() = torch::ones({3});
  nan_faults.after_backward(5, {p}, /*replay=*/true);
  EXPECT_TRUE(p.grad().isnan().all().item<bool>()) << "a NaN the step makes comes back";
}

}  // namespace
}  // namespace keel::train
