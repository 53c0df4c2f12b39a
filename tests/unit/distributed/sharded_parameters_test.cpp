// ZeRO-3 against one process: ranks (threads) whose weights are sharded by unit, gathered as the
// model runs and released after, end a backward pass with the mean gradient one process computes
// on the whole batch, in their own parts; no unit stays gathered, and no more than the unit
// computing, the next one and the head unit are gathered at once.
#include "distributed/sharded_parameters.h"

#include <gtest/gtest.h>

#include <thread>

#include "model/transformer.h"
#include "optim/precision.h"
#include "unit/distributed/thread_world.h"

namespace keel::distributed {
namespace {

using torch::Tensor;
using Mode = config::ActivationCheckpointing;

config::ModelConfig small(Mode mode, bool tied) {
  config::ModelConfig c;
  c.arch = config::Arch::kLlama;
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_layers = 3;
  c.n_heads = 4;
  c.seq_len = 16;
  c.dropout = 0.0;
  c.tie_embeddings = tied;
  c.activation_checkpointing = mode;
  return c;
}

// The same weights as `from`.
model::Transformer copy_of(const config::ModelConfig& c, const model::Transformer& from) {
  model::Transformer m(c);
  torch::NoGradGuard no_grad;
  auto dst = m->named_parameters();
  for (const auto& item : from->named_parameters()) dst[item.key()].copy_(item.value());
  return m;
}

struct RankOutcome {
  std::map<std::string, Tensor> grads;  // this rank's reduced parts: "<name>@<first element>"
  Tensor eval_logits;
  int64_t gathered_after = -1, peak = -1, gathered_after_backward = -1;
};

void expect_sharded_grads_match(Mode mode, bool tied, int world) {
  const auto c = small(mode, tied);
  torch::manual_seed(3);
  model::Transformer reference(c);
  const Tensor tokens = torch::randint(c.vocab_size, {4, c.seq_len + 1}, torch::kLong);
  const Tensor inputs = tokens.slice(1, 0, -1), targets = tokens.slice(1, 1);
  reference->loss(inputs, targets).loss.backward();
  Tensor reference_logits;
  {
    torch::NoGradGuard no_grad;
    reference->eval();
    reference_logits = reference->forward(inputs);
  }

  ThreadWorld shared(world);
  std::vector<RankOutcome> out(world);
  std::vector<model::Transformer> models;
  for (int r = 0; r < world; ++r) models.push_back(copy_of(c, reference));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadComm comm(&shared, r, world);
      model::Transformer& m = models[r];
      std::vector<std::pair<std::string, Tensor>> named;
      for (auto& item : m->named_parameters()) named.emplace_back(item.key(), item.value());
      ShardedParameters sharded(comm, named, m->parameter_units(), config::ReduceDtype::kFp32,
                                torch::kFloat, torch::kCPU);
      m->set_unit_gate(&sharded);
      const int64_t rows = 4 / world;  // this rank's share of the batch
      sharded.arm(/*accumulate=*/false);
      m->loss(inputs.narrow(0, r * rows, rows), targets.narrow(0, r * rows, rows)).loss.backward();
      sharded.finish();
      out[r].gathered_after_backward = sharded.gathered_units();
      for (const auto& piece : sharded.owned_pieces())
        out[r].grads[sharded.name_of(piece.param) + "@" + std::to_string(piece.begin)] =
            sharded.reduced_grad(piece).clone();
      out[r].peak = sharded.peak_gathered_units();
      torch::NoGradGuard no_grad;
      m->eval();
      out[r].eval_logits = m->forward(inputs);
      out[r].gathered_after = sharded.gathered_units();
      m->set_unit_gate(nullptr);
    });
  }
  for (auto& t : threads) t.join();

  std::map<std::string, Tensor> whole;
  for (const auto& item : reference->named_parameters()) whole[item.key()] = item.value().grad();
  int64_t covered = 0;
  for (int r = 0; r < world; ++r) {
    for (const auto& [key, g] : out[r].grads) {
      const auto at = key.rfind('@');
      const Tensor expected = whole.at(key.substr(0, at))
                                  .reshape({-1})
                                  .narrow(0, std::stoll(key.substr(at + 1)), g.numel());
      EXPECT_TRUE(torch::allclose(g, expected, 1e-5, 1e-6)) << key << " on rank " << r;
      covered += g.numel();
    }
    EXPECT_EQ(out[r].gathered_after_backward, 0) << "rank " << r;
    EXPECT_EQ(out[r].gathered_after, 0) << "rank " << r;
    EXPECT_LE(out[r].peak, 3) << "rank " << r;
    EXPECT_TRUE(torch::allclose(out[r].eval_logits, reference_logits, 1e-5, 1e-6)) << r;
  }
  EXPECT_EQ(covered, reference->num_parameters());
}

TEST(ShardedParameters, TwoRanksReduceTheGradientOfTheWholeBatch) {
  expect_sharded_grads_match(Mode::kNone, /*tied=*/false, 2);
}

TEST(ShardedParameters, FullRecomputeGathersTheBlockAgainForItsBackwardPass) {
  expect_sharded_grads_match(Mode::kFull, /*tied=*/false, 2);
}

TEST(ShardedParameters, SelectiveRecomputeAndTiedEmbeddingsAtFourRanks) {
  expect_sharded_grads_match(Mode::kSelective, /*tied=*/true, 4);
}

// Under bf16 autocast the units are gathered in bf16 (the parameters are bf16 while they compute,
// so autocast makes no copies of its own) and the fp32 parts receive the gradient that one process
// with fp32 weights under the same autocast computes, to bf16's precision.
TEST(ShardedParameters, Bf16GathersTheWeightsInTheComputeDtype) {
  const auto c = small(Mode::kNone, /*tied=*/false);
  torch::manual_seed(5);
  model::Transformer reference(c);
  const Tensor tokens = torch::randint(c.vocab_size, {4, c.seq_len + 1}, torch::kLong);
  const Tensor inputs = tokens.slice(1, 0, -1), targets = tokens.slice(1, 1);
  {
    optim::AutocastScope autocast(torch::kCPU, config::Precision::kBf16);
    reference->loss(inputs, targets).loss.backward();
  }
  ThreadWorld shared(2);
  std::vector<model::Transformer> models = {copy_of(c, reference), copy_of(c, reference)};
  std::vector<std::map<std::string, Tensor>> grads(2);
  std::vector<torch::ScalarType> seen(2, torch::kFloat);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ThreadComm comm(&shared, r, 2);
      model::Transformer& m = models[r];
      std::vector<std::pair<std::string, Tensor>> named;
      for (auto& item : m->named_parameters()) named.emplace_back(item.key(), item.value());
      ShardedParameters sharded(comm, named, m->parameter_units(), config::ReduceDtype::kFp32,
                                torch::kBFloat16, torch::kCPU);
      m->set_unit_gate(&sharded);
      seen[r] = named[0].second.scalar_type();
      sharded.arm(/*accumulate=*/false);
      {
        optim::AutocastScope autocast(torch::kCPU, config::Precision::kBf16);
        m->loss(inputs.narrow(0, 2 * r, 2), targets.narrow(0, 2 * r, 2)).loss.backward();
      }
      sharded.finish();
      for (const auto& piece : sharded.owned_pieces())
        grads[r][sharded.name_of(piece.param) + "@" + std::to_string(piece.begin)] =
            sharded.reduced_grad(piece).clone();
      EXPECT_EQ(sharded.reduced_grad(sharded.owned_pieces()[0]).scalar_type(), torch::kFloat);
      m->set_unit_gate(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  std::map<std::string, Tensor> whole;
  for (const auto& item : reference->named_parameters()) whole[item.key()] = item.value().grad();
  std::vector<Tensor> mine, theirs;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(seen[r], torch::kBFloat16);
    for (const auto& [key, g] : grads[r]) {
      const auto at = key.rfind('@');
      mine.push_back(g);
      theirs.push_back(whole.at(key.substr(0, at))
                           .reshape({-1})
                           .narrow(0, std::stoll(key.substr(at + 1)), g.numel()));
    }
  }
  const Tensor a = torch::cat(mine), b = torch::cat(theirs);
  const double cosine = (a.dot(b) / (a.norm() * b.norm())).item<double>();
  EXPECT_GT(cosine, 0.999);
  EXPECT_NEAR(a.norm().item<double>() / b.norm().item<double>(), 1.0, 0.02);
}

// A model built with its parameters deferred holds no memory for them; ZeRO-3 asks for their
// values unit by unit, in unit order, and ends with the parts of the model those values make:
// each rank's weights are its slice of the whole model, and the forward pass computes what the
// whole model computes.
TEST(ShardedParameters, DeferredParametersGetTheirValuesUnitByUnit) {
  const auto c = small(Mode::kNone, /*tied=*/false);
  torch::manual_seed(9);
  model::Transformer reference(c);
  std::map<std::string, Tensor> values;
  for (const auto& item : reference->named_parameters()) values[item.key()] = item.value();
  const Tensor inputs = torch::randint(c.vocab_size, {2, c.seq_len}, torch::kLong);
  Tensor expected;
  {
    torch::NoGradGuard no_grad;
    reference->eval();
    expected = reference->forward(inputs);
  }
  const int world = 2;
  ThreadWorld shared(world);
  std::vector<std::vector<std::string>> asked(world);
  std::vector<Tensor> logits(world);
  std::vector<int64_t> bytes_before(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadComm comm(&shared, r, world);
      model::Transformer m(c, model::TransformerImpl::Parameters::kDeferred);
      std::vector<std::pair<std::string, Tensor>> named;
      for (auto& item : m->named_parameters()) {
        named.emplace_back(item.key(), item.value());
        bytes_before[r] += static_cast<int64_t>(item.value().storage().nbytes());
      }
      ShardedParameters sharded(comm, named, m->parameter_units(), config::ReduceDtype::kFp32,
                                torch::kFloat, torch::kCPU,
                                [&, r](const std::string& name, Tensor& value) {
                                  asked[r].push_back(name);
                                  value.copy_(values.at(name));
                                });
      m->set_unit_gate(&sharded);
      for (const auto& piece : sharded.owned_pieces()) {
        const Tensor whole = values.at(sharded.name_of(piece.param)).reshape({-1});
        EXPECT_TRUE(torch::equal(sharded.owned_weights(piece),
                                 whole.narrow(0, piece.begin, piece.numel())));
      }
      torch::NoGradGuard no_grad;
      m->eval();
      logits[r] = m->forward(inputs);
      m->set_unit_gate(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> unit_order;
  for (const auto& names : reference->parameter_units().names)
    unit_order.insert(unit_order.end(), names.begin(), names.end());
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(bytes_before[r], 0) << "rank " << r;
    EXPECT_EQ(asked[r], unit_order) << "rank " << r;
    EXPECT_TRUE(torch::allclose(logits[r], expected, 1e-5, 1e-6)) << "rank " << r;
  }
}

// Initialized unit by unit in unit order, a deferred model draws the numbers the whole model
// draws: its weights do not depend on whether ZeRO-3 built it, tied embeddings or not.
TEST(ShardedParameters, UnitByUnitInitializationDrawsWhatTheWholeModelDraws) {
  for (bool tied : {false, true}) {
    auto c = small(Mode::kNone, tied);
    c.arch = config::Arch::kGpt2;  // biases and LayerNorm too
    torch::manual_seed(11);
    model::Transformer whole(c);
    model::Transformer deferred(c, model::TransformerImpl::Parameters::kDeferred);
    auto params = deferred->named_parameters();
    torch::manual_seed(11);
    for (const auto& names : deferred->parameter_units().names) {
      for (const auto& name : names) {
        EXPECT_FALSE(model::holds_memory(params[name])) << name;
        Tensor value = torch::empty(params[name].sizes());
        model::initialize_parameter(c, name, value);
        EXPECT_TRUE(torch::equal(value, whole->named_parameters()[name])) << name << " " << tied;
      }
    }
  }
}

}  // namespace
}  // namespace keel::distributed
