// The memory plan: what each setting saves, the cheapest change that fits, and the plan against
// what the CPU's caching allocator measures for a forward and backward pass.
#include "model/memory_plan.h"

#include <gtest/gtest.h>

#include "common/host_allocator.h"
#include "model/transformer.h"

namespace keel::model {
namespace {

using config::ActivationCheckpointing;

config::Config base() {
  config::Config c;
  c.model.vocab_size = 50304;
  c.model.d_model = 768;
  c.model.n_layers = 12;
  c.model.n_heads = 12;
  c.model.seq_len = 1024;
  c.data.micro_batch_size = 8;
  c.run.precision = config::Precision::kBf16;
  return c;
}

TEST(MemoryPlan, EachSettingSavesWhatItShould) {
  const MemoryPlanOptions one;
  auto c = base();
  const auto plain = plan_memory(c, one);
  EXPECT_EQ(plain.parameters, config::parameter_count(c.model));
  EXPECT_DOUBLE_EQ(plain.weights, 4.0 * plain.parameters);
  EXPECT_DOUBLE_EQ(plain.optimizer, 8.0 * plain.parameters);
  EXPECT_DOUBLE_EQ(plain.copies, 2.0 * plain.parameters);  // bf16 autocast copies

  c.model.activation_checkpointing = ActivationCheckpointing::kSelective;
  const auto selective = plan_memory(c, one);
  c.model.activation_checkpointing = ActivationCheckpointing::kFull;
  const auto full = plan_memory(c, one);
  EXPECT_LT(selective.activations, plain.activations);
  EXPECT_LT(full.activations * 3, plain.activations);

  // On CUDA the chunked loss is on by default: a chunk's logits instead of all 8 x 1024 tokens'.
  c.model.chunked_loss = config::Switch::kOff;
  const auto whole = plan_memory(c, one);
  EXPECT_NEAR(whole.logits, 3.0 * 8 * 1024 * 50304 * 4, 1.0);
  EXPECT_LT(full.logits * 10, whole.logits);

  // ZeRO-1 over 4 ranks: a quarter of the optimizer state each.
  c.distributed.zero = 1;
  MemoryPlanOptions four;
  four.world_size = 4;
  EXPECT_DOUBLE_EQ(plan_memory(c, four).optimizer, 2.0 * plain.parameters);
}

TEST(MemoryPlan, UnderACudaGraphTheUpdatesSnapshotComesOnTopOfThePass) {
  const auto c = base();
  MemoryPlanOptions graphs;
  graphs.cuda_graphs = true;
  const auto eager = plan_memory(c, MemoryPlanOptions());
  const auto captured = plan_memory(c, graphs);
  EXPECT_TRUE(captured.graphs);
  EXPECT_DOUBLE_EQ(captured.total(), captured.model_states() + captured.activations +
                                         captured.transient() + captured.snapshot);
  EXPECT_DOUBLE_EQ(captured.total() - eager.total(),
                   std::min(eager.activations + eager.transient(), eager.snapshot));
  EXPECT_NE(format_memory_plan(captured, c).find("CUDA graphs"), std::string::npos);
  graphs.cuda = false;  // nothing is captured on the CPU
  EXPECT_DOUBLE_EQ(plan_memory(c, graphs).total(), plan_memory(c,
                                                               [] {
                                                                 MemoryPlanOptions o;
                                                                 o.cuda = false;
                                                                 return o;
                                                               }())
                                                       .total());
}

TEST(MemoryPlan, CheapestFitNamesTheFirstChangeThatFits) {
  auto c = base();
  c.model.chunked_loss = config::Switch::kOff;
  const MemoryPlanOptions one;
  auto chunked = c;
  chunked.model.chunked_loss = config::Switch::kOn;
  const double budget = plan_memory(chunked, one).total() * 1.001;
  ASSERT_GT(plan_memory(c, one).total(), budget);
  EXPECT_EQ(cheapest_fit(c, one, budget), std::optional<std::string>("model.chunked_loss: on"));
  auto full = c;
  full.model.chunked_loss = config::Switch::kOn;
  full.model.activation_checkpointing = ActivationCheckpointing::kFull;
  const auto fit = cheapest_fit(c, one, plan_memory(full, one).total() * 1.01);
  ASSERT_TRUE(fit);
  EXPECT_NE(fit->find("model.activation_checkpointing: full"), std::string::npos) << *fit;
  EXPECT_EQ(cheapest_fit(c, one, 1e6), std::nullopt);  // 1 MB holds not even the weights
}

}  // namespace
}  // namespace keel::model
