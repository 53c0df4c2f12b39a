// Generation: the KV-cached forward gives the full forward's logits position by position (llama
// with grouped-query attention and qk-norm, gpt2), greedy decoding is the argmax chain, sampling
// is reproducible by seed, and output can outgrow the context window.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"

namespace keel::model {
namespace {

using torch::Tensor;

config::ModelConfig tiny_for_generation(const std::string& arch, int64_t kv_heads = 0,
                                        bool qk_norm = false) {
  config::ModelConfig c;
  c.arch = *config::parse_choice<config::Arch>(arch);
  c.vocab_size = 48;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = kv_heads;
  c.qk_norm = qk_norm ? config::Switch::kOn : config::Switch::kOff;
  c.seq_len = 16;
  c.init_std = 0.2;  // weights far from uniform: logits that differ between positions
  return c;
}

class CachedForward : public ::testing::TestWithParam<config::ModelConfig> {};

// A prompt of 5 prefilled at once, then one position at a time to the window's end.
TEST_P(CachedForward, EqualsTheFullForwardAtEveryPosition) {
  torch::manual_seed(3);
  Transformer m(GetParam());
  m->eval();
  torch::NoGradGuard no_grad;
  const Tensor ids = torch::randint(0, 48, {2, 16});
  const Tensor full = m->forward(ids);  // (2, 16, V)
  KvCache cache;
  const Tensor prefill = m->forward_cached(ids.narrow(1, 0, 5), cache);
  EXPECT_EQ(cache.length, 5);
  EXPECT_LT((prefill - full.narrow(1, 0, 5)).abs().max().item<double>(), 1e-5);
  for (int64_t t = 5; t < 16; ++t) {
    const Tensor step = m->forward_cached(ids.narrow(1, t, 1), cache);
    EXPECT_LT((step - full.narrow(1, t, 1)).abs().max().item<double>(), 1e-5) << "position " << t;
  }
  EXPECT_THROW(m->forward_cached(ids.narrow(1, 0, 1), cache), DataError);  // past seq_len
}

INSTANTIATE_TEST_SUITE_P(Archs, CachedForward,
                         ::testing::Values(tiny_for_generation("llama"),
                                           tiny_for_generation("llama", 2),
                                           tiny_for_generation("llama", 1, true),
                                           tiny_for_generation("gpt2")));

TEST(Generate, GreedyIsTheArgmaxChainAndStopsAtTheStopId) {
  torch::manual_seed(4);
  Transformer m(tiny_for_generation("llama", 2));
  const std::vector<int64_t> prompt = {1, 2, 3};
  GenerateOptions o;
  o.temperature = 0;
  o.max_new_tokens = 6;
  const auto out = generate(m, prompt, o);
  ASSERT_EQ(out.size(), 6u);
  std::vector<int64_t> ids = prompt;
  torch::NoGradGuard no_grad;
  for (int64_t expected : out) {  // each id is the argmax of the full forward over what precedes
    const auto logits = m->forward(torch::tensor(ids, torch::kLong).unsqueeze(0));
    EXPECT_EQ(logits[0][-1].argmax().item<int64_t>(), expected);
    ids.push_back(expected);
  }
  o.stop_id = out[2];  // generation ends at its first occurrence, which it includes
  const auto first_stop = std::find(out.begin(), out.end(), *o.stop_id);
  const auto stopped = generate(m, prompt, o);
  EXPECT_EQ(stopped, std::vector<int64_t>(out.begin(), first_stop + 1));
}

TEST(Generate, SamplingIsReproducibleBySeedAndTopOneIsGreedy) {
  torch::manual_seed(5);
  Transformer m(tiny_for_generation("gpt2"));
  GenerateOptions o;
  o.temperature = 1.0;
  o.top_k = 0;
  o.max_new_tokens = 12;
  o.seed = 7;
  const auto a = generate(m, {4, 5}, o), b = generate(m, {4, 5}, o);
  EXPECT_EQ(a, b);
  o.seed = 8;
  EXPECT_NE(generate(m, {4, 5}, o), a);
  o.top_k = 1;
  GenerateOptions greedy = o;
  greedy.temperature = 0;
  EXPECT_EQ(generate(m, {4, 5}, o), generate(m, {4, 5}, greedy));
}

TEST(Generate, OutputOutgrowsTheContextWindow) {
  torch::manual_seed(6);
  Transformer m(tiny_for_generation("llama"));
  GenerateOptions o;
  o.temperature = 0;
  o.max_new_tokens = 40;  // prompt 10 + 40 > seq_len 16
  const std::vector<int64_t> prompt(10, 3);
  EXPECT_EQ(generate(m, prompt, o).size(), 40u);
  EXPECT_THROW(generate(m, {}, o), UserError);
}

}  // namespace
}  // namespace keel::model
