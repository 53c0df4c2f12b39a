// Transformer shapes, weight tying, causality, losses, initialisation and gradient accumulation.
#include "model/transformer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "config/validate.h"

namespace keel::model {
namespace {

using torch::Tensor;

constexpr int64_t kVocab = 64;

config::ModelConfig tiny(const std::string& arch) {
  config::ModelConfig c;
  c.arch = *config::parse_choice<config::Arch>(arch);
  c.vocab_size = kVocab;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.seq_len = 16;
  return c;
}

Tensor tokens(int64_t B, int64_t T, int64_t seed = 0) {
  torch::manual_seed(seed);
  return torch::randint(0, kVocab, {B, T});
}

Tensor param(Transformer& m, const std::string& name) { return m->named_parameters()[name]; }

class ArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchTest, LogitShapes) {
  Transformer m(tiny(GetParam()));
  EXPECT_EQ(m->forward(tokens(3, 16)).sizes(), (std::vector<int64_t>{3, 16, kVocab}));
  EXPECT_EQ(m->forward(tokens(2, 5)).sizes(), (std::vector<int64_t>{2, 5, kVocab}));
  EXPECT_THROW(m->forward(tokens(1, 17)), DataError);  // longer than seq_len
}

TEST_P(ArchTest, CausalNoLogitBeforeAChangedTokenMoves) {
  auto cfg = tiny(GetParam());
  cfg.qk_norm = config::Switch::kOn;
  Transformer m(cfg);
  m->eval();
  auto x = tokens(2, 12);
  const auto before = m->forward(x);
  const int64_t t = 7;
  x.index_put_({torch::indexing::Slice(), t},
               (x.index({torch::indexing::Slice(), t}) + 1) % kVocab);
  const auto after = m->forward(x);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(before.index({Slice(), Slice(0, t)}),
                              after.index({Slice(), Slice(0, t)}), 0.0, 1e-6));
  EXPECT_FALSE(torch::allclose(before.index({Slice(), t}), after.index({Slice(), t}), 0.0, 1e-4));
}

TEST_P(ArchTest, PerSampleLossMeanEqualsCeLoss) {
  Transformer m(tiny(GetParam()));
  const auto out = m->loss(tokens(4, 16, 1), tokens(4, 16, 2));
  EXPECT_EQ(out.per_sample_loss.sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(out.loss.dim(), 0);
  EXPECT_EQ(out.loss.scalar_type(), torch::kFloat);
  EXPECT_NEAR(out.per_sample_loss.mean().item<double>(), out.ce_loss.item<double>(), 1e-6);
  EXPECT_NEAR(out.loss.item<double>(), out.ce_loss.item<double>(), 1e-6);  // no z-loss
  EXPECT_FALSE(out.ce_loss.requires_grad());
  EXPECT_FALSE(out.per_sample_loss.requires_grad());
  EXPECT_NEAR(out.ce_loss.item<double>(), std::log(static_cast<double>(kVocab)),
              0.2);  // near uniform at init
}

TEST_P(ArchTest, ZLossIncreasesLossButNotCrossEntropy) {
  auto cfg = tiny(GetParam());
  torch::manual_seed(5);
  Transformer plain(cfg);
  cfg.z_loss = 1e-2;
  torch::manual_seed(5);
  Transformer with_z(cfg);
  const auto x = tokens(2, 16, 1), y = tokens(2, 16, 2);
  const auto a = plain->loss(x, y), b = with_z->loss(x, y);
  EXPECT_NEAR(a.ce_loss.item<double>(), b.ce_loss.item<double>(), 1e-5);
  // log Z is about log V at init, so the term is about 1e-2 * log(64)^2.
  const double lse = std::log(static_cast<double>(kVocab));
  EXPECT_NEAR(b.loss.item<double>() - b.ce_loss.item<double>(), 1e-2 * lse * lse, 0.01);
}

// 4 micro-batches of 4 sequences, each loss scaled by 1/4, accumulate the gradients of one batch of
// 16: the invariant behind grad_accum_steps.
TEST_P(ArchTest, GradientAccumulationMatchesFullBatch) {
  torch::manual_seed(3);
  Transformer m(tiny(GetParam()));
  const auto x = tokens(16, 16, 1), y = tokens(16, 16, 2);
  m->loss(x, y).loss.backward();
  std::map<std::string, Tensor> full;
  for (auto& item : m->named_parameters()) {
    full[item.key()] = item.value().grad().clone();
    item.value().mutable_grad().reset();
  }
  for (int64_t k = 0; k < 4; ++k) {
    const auto rows = torch::indexing::Slice(4 * k, 4 * (k + 1));
    (m->loss(x.index({rows}), y.index({rows})).loss / 4).backward();
  }
  for (auto& item : m->named_parameters()) {
    const auto& want = full.at(item.key());
    const double rel =
        (item.value().grad() - want).norm().item<double>() / (want.norm().item<double>() + 1e-30);
    EXPECT_LT(rel, 1e-5) << item.key();
  }
}

TEST_P(ArchTest, InitScalesOutputProjectionsAndSetsNormsAndBiases) {
  auto cfg = tiny(GetParam());
  cfg.d_model = 128;
  cfg.n_layers = 8;
  cfg.init_std = 0.02;
  Transformer m(cfg);
  const double out_std = 0.02 / std::sqrt(16.0);
  EXPECT_NEAR(param(m, "layers.3.attn.proj.weight").std().item<double>(), out_std, 0.1 * out_std);
  EXPECT_NEAR(param(m, "layers.3.mlp.proj.weight").std().item<double>(), out_std, 0.1 * out_std);
  EXPECT_NEAR(param(m, "layers.3.mlp.fc.weight").std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(param(m, "tok_emb.weight").std().item<double>(), 0.02, 0.002);
  for (const auto& item : m->named_parameters()) {
    const auto& name = item.key();
    if (name.find("norm.weight") != std::string::npos) {
      EXPECT_TRUE(torch::equal(item.value(), torch::ones_like(item.value()))) << name;
    }
    if (name.size() > 5 && name.substr(name.size() - 5) == ".bias") {
      EXPECT_TRUE(torch::equal(item.value(), torch::zeros_like(item.value()))) << name;
    }
  }
}

TEST_P(ArchTest, TiedHeadSharesTheEmbedding) {
  auto cfg = tiny(GetParam());
  cfg.tie_embeddings = true;
  Transformer tied(cfg);
  cfg.tie_embeddings = false;
  Transformer untied(cfg);
  EXPECT_EQ(tied->named_parameters().find("lm_head.weight"), nullptr);
  EXPECT_EQ(param(untied, "lm_head.weight").sizes(), (std::vector<int64_t>{kVocab, 32}));
  EXPECT_EQ(untied->num_parameters() - tied->num_parameters(), kVocab * 32);
  // The head's gradient lands on the embedding: rows of tokens never fed in get one only through
  // the output projection.
  const auto x = torch::zeros({1, 4}, torch::kLong);  // only token 0 is an input
  tied->loss(x, torch::full({1, 4}, 5, torch::kLong)).loss.backward();
  EXPECT_GT(param(tied, "tok_emb.weight").grad()[5].abs().sum().item<double>(), 0.0);
  // Changing the embedding table changes the head in place.
  {
    torch::NoGradGuard g;
    param(tied, "tok_emb.weight")[7].zero_();
  }
  const auto logits = tied->forward(x);
  EXPECT_TRUE(torch::equal(logits.index({0, torch::indexing::Slice(), 7}), torch::zeros({4})));
}

TEST_P(ArchTest, DropoutOnlyInTrainMode) {
  auto cfg = tiny(GetParam());
  cfg.dropout = 0.5;
  Transformer m(cfg);
  const auto x = tokens(2, 8);
  m->train();
  EXPECT_FALSE(torch::equal(m->forward(x), m->forward(x)));
  m->eval();
  EXPECT_TRUE(torch::equal(m->forward(x), m->forward(x)));
}

TEST_P(ArchTest, LayerPrefixesAndFlops) {
  auto cfg = tiny(GetParam());
  Transformer m(cfg);
  const auto prefixes = m->layer_prefixes();
  ASSERT_EQ(prefixes.size(), 2u);
  EXPECT_EQ(prefixes[1], "layers.1.");
  int64_t in_layers = 0;
  for (const auto& item : m->named_parameters()) {
    if (item.key().rfind("layers.", 0) == 0) in_layers += item.value().numel();
  }
  int64_t per_prefix = 0;
  for (const auto& prefix : prefixes) {
    for (const auto& item : m->named_parameters()) {
      if (item.key().rfind(prefix, 0) == 0) per_prefix += item.value().numel();
    }
  }
  EXPECT_EQ(per_prefix, in_layers);
  // 6 * (non-embedding params) + 12 L C T + 6 C V; non-embedding = layers + final norm.
  int64_t non_embedding = in_layers;
  for (const auto& item : m->named_parameters()) {
    if (item.key().rfind("final_norm", 0) == 0) non_embedding += item.value().numel();
  }
  const double want = 6.0 * non_embedding + 12.0 * 2 * 32 * 16 + 6.0 * 32 * kVocab;
  EXPECT_DOUBLE_EQ(m->flops_per_token(), want);
}

// `keel validate` estimates from the config alone; it must agree with the built model, tied or
// not, grouped attention or not.
TEST_P(ArchTest, ConfigEstimatesMatchTheBuiltModel) {
  for (bool tied : {true, false}) {
    for (int64_t kv_heads : {0, 2}) {
      auto cfg = tiny(GetParam());
      cfg.tie_embeddings = tied;
      cfg.n_kv_heads = kv_heads;
      cfg.qk_norm = kv_heads == 2 ? config::Switch::kOn : config::Switch::kOff;
      Transformer m(cfg);
      EXPECT_EQ(config::parameter_count(cfg), m->num_parameters()) << tied << kv_heads;
      EXPECT_DOUBLE_EQ(config::flops_per_token(cfg), m->flops_per_token()) << tied << kv_heads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaAndGpt2, ArchTest, ::testing::Values("llama", "gpt2"));

TEST(TransformerTest, LlamaHasNoBiasesAndGpt2Has) {
  Transformer llama(tiny("llama")), gpt2(tiny("gpt2"));
  EXPECT_EQ(llama->named_parameters().find("layers.0.attn.qkv.bias"), nullptr);
  EXPECT_EQ(llama->named_parameters().find("pos_emb.weight"), nullptr);
  EXPECT_NE(gpt2->named_parameters().find("layers.0.mlp.fc.bias"), nullptr);
  EXPECT_NE(gpt2->named_parameters().find("layers.0.attn_norm.bias"), nullptr);
  EXPECT_NE(gpt2->named_parameters().find("pos_emb.weight"), nullptr);
}

TEST(TransformerTest, GroupedQueryAttentionShapes) {
  auto cfg = tiny("llama");
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;  // head dim 4: q 8*4, k and v 2*4 each
  cfg.qk_norm = config::Switch::kOn;
  Transformer m(cfg);
  EXPECT_EQ(param(m, "layers.0.attn.qkv.weight").sizes(), (std::vector<int64_t>{32 + 8 + 8, 32}));
  EXPECT_EQ(param(m, "layers.0.attn.q_norm.weight").sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(m->forward(tokens(2, 16)).sizes(), (std::vector<int64_t>{2, 16, kVocab}));
  cfg.n_kv_heads = 1;  // multi-query
  Transformer mqa(cfg);
  EXPECT_EQ(mqa->forward(tokens(2, 16)).sizes(), (std::vector<int64_t>{2, 16, kVocab}));
  cfg.n_kv_heads = 3;
  EXPECT_THROW(Transformer{cfg}, ConfigError);
}

TEST(TransformerTest, SwiGluHiddenSizeFollowsEffectiveDff) {
  auto cfg = tiny("llama");
  cfg.d_ff = 48;
  Transformer m(cfg);
  EXPECT_EQ(param(m, "layers.0.mlp.fc.weight").sizes(), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(param(m, "layers.0.mlp.proj.weight").sizes(), (std::vector<int64_t>{32, 48}));
}

}  // namespace
}  // namespace keel::model

namespace keel::model {
namespace {

TEST(TransformerTest, AttentionOutputStdPerLayerAfterTrainingForward) {
  Transformer m(tiny("llama"));
  EXPECT_TRUE(m->attention_output_std().empty());
  m->train();
  m->forward(tokens(2, 8));
  const auto stds = m->attention_output_std();
  ASSERT_EQ(stds.size(), 2u);
  for (double s : stds) EXPECT_GT(s, 0.0);
}

}  // namespace
}  // namespace keel::model
