// Activation checkpointing: the gradients of a run that recomputes are those of a run that keeps
// (bit for bit for whole blocks), dropout draws the same masks, the run's random stream does not
// move, and it keeps less.
#include "model/recompute.h"

#include <gtest/gtest.h>

#include "common/host_allocator.h"
#include "model/memory_plan.h"
#include "model/transformer.h"
#include "optim/precision.h"

namespace keel::model {
namespace {

using torch::Tensor;
using Mode = config::ActivationCheckpointing;

config::ModelConfig small(const std::string& arch, Mode mode, double dropout = 0.1) {
  config::ModelConfig c;
  c.arch = *config::parse_choice<config::Arch>(arch);
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_layers = 3;
  c.n_heads = 4;
  c.seq_len = 16;
  c.dropout = dropout;
  c.activation_checkpointing = mode;
  return c;
}

struct StepOutcome {
  std::vector<double> losses;
  std::vector<Tensor> grads;
  Tensor rng_after;
};

// Two training steps' losses and gradients (summed), from the same weights and random stream.
StepOutcome two_steps(const config::ModelConfig& c, optim::Precision precision) {
  torch::manual_seed(7);
  Transformer m(c);
  m->train();
  StepOutcome out;
  for (int step = 0; step < 2; ++step) {
    const auto tokens = torch::randint(0, c.vocab_size, {2, c.seq_len + 1});
    LossOutput l;
    {
      optim::AutocastScope autocast(torch::kCPU, precision);
      l = m->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1));
    }
    (l.per_sample_objective * torch::tensor({1.0f, 0.5f})).sum().backward();
    out.losses.push_back(l.loss.item<double>());
  }
  for (const auto& p : m->parameters()) out.grads.push_back(p.grad().clone());
  out.rng_after = at::globalContext().defaultGenerator(torch::kCPU).get_state();
  return out;
}

double max_relative_error(const StepOutcome& a, const StepOutcome& b) {
  double worst = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const double scale = std::max(b.grads[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a.grads[i] - b.grads[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

class RecomputeArch : public ::testing::TestWithParam<std::string> {};

TEST_P(RecomputeArch, FullIsBitIdenticalWithDropout) {
  const auto plain = two_steps(small(GetParam(), Mode::kNone), optim::Precision::kFp32);
  const auto full = two_steps(small(GetParam(), Mode::kFull), optim::Precision::kFp32);
  EXPECT_EQ(full.losses, plain.losses);
  ASSERT_EQ(full.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i)
    EXPECT_TRUE(torch::equal(full.grads[i], plain.grads[i])) << "gradient " << i;
  // Recomputing replays the dropout masks without moving the run's random stream.
  EXPECT_TRUE(torch::equal(full.rng_after, plain.rng_after));
}

TEST_P(RecomputeArch, SelectiveGivesTheSameGradients) {
  const auto plain = two_steps(small(GetParam(), Mode::kNone), optim::Precision::kFp32);
  const auto selective = two_steps(small(GetParam(), Mode::kSelective), optim::Precision::kFp32);
  for (size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_NEAR(selective.losses[i], plain.losses[i], 1e-6 * std::abs(plain.losses[i]));
  EXPECT_LE(max_relative_error(selective, plain), 1e-5);
  EXPECT_TRUE(torch::equal(selective.rng_after, plain.rng_after));
}

TEST_P(RecomputeArch, UnderBf16AutocastTheRecomputationRunsInBf16Too) {
  const auto plain = two_steps(small(GetParam(), Mode::kNone, 0.0), optim::Precision::kBf16);
  for (Mode mode : {Mode::kFull, Mode::kSelective}) {
    const auto again = two_steps(small(GetParam(), mode, 0.0), optim::Precision::kBf16);
    // Recomputed in fp32 instead, the gradients would differ by bf16's rounding (~1e-2).
    EXPECT_LE(max_relative_error(again, plain), mode == Mode::kFull ? 0.0 : 1e-3)
        << config::name_of(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Model, RecomputeArch, ::testing::Values("llama", "gpt2"));

TEST(Recompute, PlainCallOutsideGradientRecording) {
  int calls = 0;
  const auto x = torch::randn({4, 3}, torch::requires_grad());
  torch::NoGradGuard no_grad;
  const auto y = recompute(
      [&](const Tensor& t) {
        ++calls;
        return t * 2;
      },
      x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

TEST(Recompute, RegionRunsTwiceAndParametersGetTheirGradients) {
  int calls = 0;
  auto w = torch::randn({3, 3}, torch::requires_grad());
  const auto x = torch::randn({4, 3}, torch::requires_grad());
  const auto y = recompute(
      [&](const Tensor& t) {
        ++calls;
        return torch::tanh(t.matmul(w));
      },
      x);
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  auto w2 = w.detach().clone().requires_grad_();
  const auto x2 = x.detach().clone().requires_grad_();
  torch::tanh(x2.matmul(w2)).sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), w2.grad()));
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad()));
}

// What the forward pass keeps for the backward pass and the step's peak, measured by the caching
// host allocator (blocks of 1 MiB and more; every tensor here is one), against the memory plan.
TEST(Recompute, MeasuredMemoryMatchesThePlan) {
  install_caching_host_allocator(size_t{8} << 30);
  auto measure = [](Mode mode, config::Switch chunked) {
    config::Config cfg;
    cfg.model = small("llama", mode, 0.0);
    cfg.model.d_model = 256;
    cfg.model.n_layers = 2;
    cfg.model.seq_len = 512;
    cfg.model.vocab_size = 4096;
    cfg.model.chunked_loss = chunked;
    // TODO(#47): the plan counts nothing for the q/k norms' activations (llama's default since
    // issue 47); measure what they keep, add it to the plan, and drop this line.
    cfg.model.qk_norm = config::Switch::kOff;
    cfg.data.micro_batch_size = 2;
    torch::manual_seed(1);
    Transformer m(cfg.model);
    const auto tokens = torch::randint(0, cfg.model.vocab_size, {2, cfg.model.seq_len + 1});
    const int64_t before = host_allocator_stats().in_use_bytes;
    reset_host_peak_in_use();
    auto l = m->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1));
    const int64_t kept = host_allocator_stats().in_use_bytes - before;
    l.loss.backward();
    const int64_t peak = host_allocator_stats().peak_in_use_bytes - before;
    MemoryPlanOptions cpu;
    cpu.cuda = false;
    const auto plan = plan_memory(cfg, cpu);
    EXPECT_NEAR(plan.activations + plan.transient(), peak, 0.1 * peak)
        << config::name_of(mode) << ", chunked_loss " << config::name_of(chunked);
    return kept;
  };
  for (Mode mode : {Mode::kNone, Mode::kSelective, Mode::kFull})
    measure(mode, config::Switch::kOff);
  const int64_t none = measure(Mode::kNone, config::Switch::kOn);
  const int64_t selective = measure(Mode::kSelective, config::Switch::kOn);
  const int64_t full = measure(Mode::kFull, config::Switch::kOn);
  EXPECT_LT(selective, none) << selective << " of " << none;
  EXPECT_LT(full * 3, none) << full << " of " << none;
  restore_default_host_allocator();
}

}  // namespace
}  // namespace keel::model
