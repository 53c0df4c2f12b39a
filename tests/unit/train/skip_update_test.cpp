// A non-finite gradient must leave the model and the optimizer exactly as they were: the real
// training step (Trainer::State::train_step) with an injected NaN gradient, compared bit for bit.
#include <gtest/gtest.h>

#include "distributed/communicator.h"
#include "scratch_dir.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace {

using keel::testing::ScratchDir;

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const auto x = a.contiguous().reshape({-1}).view(torch::kUInt8);
  const auto y = b.contiguous().reshape({-1}).view(torch::kUInt8);
  return torch::equal(x, y);
}

void expect_same_tensors(const std::map<std::string, torch::Tensor>& before,
                         const std::map<std::string, torch::Tensor>& after, const char* what) {
  ASSERT_EQ(before.size(), after.size()) << what;
  ASSERT_FALSE(before.empty()) << what;
  for (const auto& [name, t] : before) {
    ASSERT_TRUE(after.count(name)) << what << " " << name;
    EXPECT_TRUE(same_bits(t, after.at(name))) << what << " " << name << " changed";
  }
}

// capture() hands out the live tensors (the checkpoint writer copies them); a snapshot to compare
// against later needs its own copy.
std::map<std::string, torch::Tensor> copied(const std::map<std::string, torch::Tensor>& tensors) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : tensors) out[name] = t.detach().clone();
  return out;
}

class SkipUpdate : public ::testing::TestWithParam<std::string> {};

TEST_P(SkipUpdate, NanGradientLeavesWeightsAndOptimizerStateBitIdentical) {
  const ScratchDir run_dir("skip_update_" + GetParam());
  config::Config cfg;
  cfg.run.device = config::Device::kCpu;
  cfg.run.max_steps = 20;
  cfg.run.deterministic = true;
  cfg.model.d_model = 32;
  cfg.model.seq_len = 16;
  cfg.data.micro_batch_size = 4;
  cfg.optim.name = *config::parse_choice<config::OptimizerName>(GetParam());
  cfg.optim.lr = 1e-3;
  cfg.schedule.warmup_steps = 2;
  cfg.eval.every_steps = 0;
  cfg.logging.progress = config::Switch::kOff;
  config::FaultSpec nan;
  nan.kind = config::FaultKind::kNanGrad;
  nan.at_step = 5;  // the sixth step attempt
  cfg.faults = {nan};
  distributed::SingleProcess comm;
  TrainOptions options;
  options.run_dir = run_dir.str();
  Trainer::State s(cfg, "", options, comm);
  s.setup();

  for (int i = 0; i < 5; ++i) s.train_step();
  ASSERT_EQ(s.counters.step, 5);
  const auto before_model = copied(s.capture().model);
  const auto before_optimizer = copied(s.capture().optimizer);
  s.train_step();  // iteration 5: NaN gradient
  EXPECT_EQ(s.counters.step, 5) << "the skipped update must not count as a step";
  EXPECT_EQ(s.counters.iteration, 6);
  expect_same_tensors(before_model, s.capture().model, "model");
  expect_same_tensors(before_optimizer, s.capture().optimizer, "optimizer");

  // And the run goes on: the next attempt updates the weights again.
  s.train_step();
  EXPECT_EQ(s.counters.step, 6);
  const auto next = s.capture();
  bool moved = false;
  for (const auto& [name, t] : before_model) moved |= !same_bits(t, next.model.at(name));
  EXPECT_TRUE(moved);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SkipUpdate, ::testing::Values("adamw", "lion"));

}  // namespace
}  // namespace keel::train
