// Precision parsing, autocast scopes (bf16 on CPU) and the dynamic loss scaler.
#include "optim/precision.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <limits>

#include "common/error.h"
#include "model/transformer.h"

namespace keel::optim {
namespace {

using torch::Tensor;

TEST(PrecisionTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(config::parse_choice<Precision>("fp32"), Precision::kFp32);
  EXPECT_EQ(config::parse_choice<Precision>("bf16"), Precision::kBf16);
  EXPECT_EQ(config::parse_choice<Precision>("fp16"), Precision::kFp16);
  EXPECT_FALSE(config::parse_choice<Precision>("fp8").has_value());
}

TEST(AutocastScopeTest, EnablesAndRestores) {
  ASSERT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  const auto dtype_before = at::autocast::get_autocast_dtype(torch::kCPU);
  {
    AutocastScope outer(torch::kCPU, Precision::kBf16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), at::kBFloat16);
    {
      AutocastScope inner(torch::kCPU, Precision::kFp16);
      EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), at::kHalf);
    }
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), at::kBFloat16);
    const auto y = torch::mm(torch::randn({4, 4}), torch::randn({4, 4}));
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), dtype_before);
  {
    AutocastScope fp32(torch::kCPU, Precision::kFp32);  // no-op
    EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  }
}

TEST(AutocastScopeTest, Bf16ForwardOnCpuIsFiniteAndCloseToFp32) {
  config::ModelConfig mc;
  mc.vocab_size = 64;
  mc.d_model = 64;
  mc.n_layers = 2;
  mc.n_heads = 4;
  mc.n_kv_heads = 2;
  mc.seq_len = 16;
  mc.qk_norm = config::Switch::kOn;
  mc.z_loss = 1e-4;
  torch::manual_seed(0);
  model::Transformer m(mc);
  const auto x = torch::randint(0, 64, {2, 16}), y = torch::randint(0, 64, {2, 16});
  const double fp32 = m->loss(x, y).loss.item<double>();
  Tensor bf16_loss, logits;
  {
    AutocastScope scope(torch::kCPU, Precision::kBf16);
    logits = m->forward(x);
    bf16_loss = m->loss(x, y).loss;
  }
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);  // autocast really ran in bf16
  EXPECT_EQ(bf16_loss.scalar_type(), at::kFloat);  // cross-entropy in fp32
  ASSERT_TRUE(std::isfinite(bf16_loss.item<double>()));
  EXPECT_NEAR(bf16_loss.item<double>(), fp32, 0.02 * fp32);
  bf16_loss.backward();  // gradients flow back to the fp32 weights
  EXPECT_EQ(m->named_parameters()["tok_emb.weight"].grad().scalar_type(), at::kFloat);
}

// ---- DynamicLossScaler -------------------------------------------------------------------------
Tensor param_with_grad(std::vector<double> g) {
  auto p = torch::zeros({static_cast<int64_t>(g.size())}, torch::requires_grad());
  p.mutable_grad() = torch::tensor(g, torch::kDouble).to(torch::kFloat);
  return p;
}

TEST(LossScalerTest, UnscalesCleanGradients) {
  DynamicLossScaler scaler(torch::kCPU, 8.0);
  auto p = param_with_grad({8.0, -16.0});
  const auto found = scaler.unscale_({p, torch::zeros({1}, torch::requires_grad())});
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({1.0f, -2.0f})));
}

TEST(LossScalerTest, InfGradientSetsFoundInfAndHalvesScale) {
  DynamicLossScaler scaler(torch::kCPU, 1024.0, 2.0, 0.5, 3);
  auto p = param_with_grad({1.0, std::numeric_limits<double>::infinity()});
  const auto found = scaler.unscale_({p});
  EXPECT_EQ(found.item<float>(), 1.0f);
  scaler.update(found);
  EXPECT_EQ(scaler.scale().item<float>(), 512.0f);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker").item<int>(), 0);
}

TEST(LossScalerTest, GrowsAfterGrowthIntervalCleanSteps) {
  DynamicLossScaler scaler(torch::kCPU, 1024.0, 2.0, 0.5, 3);
  for (int i = 0; i < 2; ++i) {
    auto p = param_with_grad({1.0});
    scaler.update(scaler.unscale_({p}));
    EXPECT_EQ(scaler.scale().item<float>(), 1024.0f) << "clean step " << i;
  }
  auto p = param_with_grad({1.0});
  scaler.update(scaler.unscale_({p}));
  EXPECT_EQ(scaler.scale().item<float>(), 2048.0f);
}

TEST(LossScalerTest, StateDictRoundTripAndShapeCheck) {
  DynamicLossScaler a(torch::kCPU, 1024.0, 2.0, 0.5, 3), b(torch::kCPU);
  a.update(torch::ones({1}));
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.scale().item<float>(), 512.0f);
  auto bad = a.state_dict();
  bad["scale"] = torch::ones({2});
  EXPECT_THROW(b.load_state_dict(bad), CheckpointError);
}

}  // namespace
}  // namespace keel::optim
