// AdamW (fused and foreach), Lion, parameter groups and gradient clipping, against updates
// computed in double precision in the test itself.
#include "optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "model/transformer.h"
#include "optim/clip.h"

namespace keel::optim {
namespace {

using torch::Tensor;
using Vec = std::vector<double>;

Tensor tensor(const Vec& v, std::vector<int64_t> shape) {
  return torch::tensor(v, torch::kDouble).to(torch::kFloat).reshape(shape);
}

Vec values(const Tensor& t) {
  auto d = t.detach().to(torch::kDouble).contiguous().flatten();
  return Vec(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void set_grad(const Tensor& p, const Tensor& g) { p.mutable_grad() = g.clone(); }

config::OptimConfig adamw_cfg(const std::string& fused) {
  config::OptimConfig c;
  c.name = config::OptimizerName::kAdamW;
  c.betas = {0.9, 0.95};
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.fused = *config::parse_choice<config::Switch>(fused);
  return c;
}

// Two parameters: "w" (2, 2) in the decay group, "out.bias" (2) in the no-decay group.
struct TwoParams {
  Tensor w = tensor({0.5, -1.0, 2.0, 0.25}, {2, 2}).requires_grad_(true);
  Tensor b = tensor({0.3, -0.7}, {2}).requires_grad_(true);
  std::vector<ParamGroup> groups(const config::OptimConfig& cfg) const {
    return make_param_groups({{"w", w}, {"out.bias", b}}, cfg);
  }
};

const std::vector<Vec> kGradW = {{0.1, -0.2, 0.3, 1.5}, {-0.4, 0.05, 0.2, -1.0}};
const std::vector<Vec> kGradB = {{0.01, -3.0}, {0.02, 2.0}};
const Vec kLr = {0.01, 0.02};

// Closed-form AdamW in double: p *= 1 - lr wd; m, v moments; p -= lr m_hat / (sqrt(v_hat) + eps).
Vec adamw_reference(Vec p, const std::vector<Vec>& grads, double wd) {
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
  Vec m(p.size(), 0.0), v(p.size(), 0.0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    const double lr = kLr[t - 1];
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[t - 1][i];
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  return p;
}

void expect_close(const Vec& got, const Vec& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::max(1.0, std::abs(want[i]))) << "element " << i;
  }
}

void expect_identical(const std::map<std::string, Tensor>& a,
                      const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, t] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    // Bitwise: compare the raw int32 views so -0.0 vs 0.0 and nan payloads would count.
    EXPECT_TRUE(torch::equal(t.view(torch::kInt), b.at(k).view(torch::kInt))) << k;
  }
}

std::map<std::string, Tensor> snapshot(const Optimizer& opt, const std::vector<Tensor>& params) {
  std::map<std::string, Tensor> s;
  for (const auto& [k, t] : opt.state_dict()) s[k] = t.clone();
  for (size_t i = 0; i < params.size(); ++i)
    s["param" + std::to_string(i)] = params[i].detach().clone();
  return s;
}

class AdamWPathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AdamWPathTest, MatchesClosedFormWithDecayAndNoDecayGroups) {
  TwoParams tp;
  const auto cfg = adamw_cfg(GetParam());
  auto opt = make_optimizer(tp.groups(cfg), cfg);
  EXPECT_EQ(opt->describe(), GetParam() == "on" ? "adamw(fused)" : "adamw(foreach)");
  const Vec w0 = values(tp.w), b0 = values(tp.b);
  for (size_t t = 0; t < 2; ++t) {
    set_grad(tp.w, tensor(kGradW[t], {2, 2}));
    set_grad(tp.b, tensor(kGradB[t], {2}));
    opt->step(kLr[t]);
  }
  expect_close(values(tp.w), adamw_reference(w0, kGradW, 0.1), 1e-6);
  expect_close(values(tp.b), adamw_reference(b0, kGradB, 0.0), 1e-6);
  EXPECT_EQ(opt->state_dict().at("group0.step").item<float>(), 2.0f);
}

TEST_P(AdamWPathTest, FoundInfSkipsStepBitIdentically) {
  TwoParams tp;
  const auto cfg = adamw_cfg(GetParam());
  auto opt = make_optimizer(tp.groups(cfg), cfg);
  const std::vector<Tensor> params = {tp.w, tp.b};
  set_grad(tp.w, tensor(kGradW[0], {2, 2}));
  set_grad(tp.b, tensor(kGradB[0], {2}));
  opt->step(kLr[0], torch::zeros({1}));  // a clean step first, so the state is non-trivial
  const auto before = snapshot(*opt, params);

  const double inf = std::numeric_limits<double>::infinity();
  set_grad(tp.w, tensor({inf, 1.0, std::nan(""), -inf}, {2, 2}));
  set_grad(tp.b, tensor({1.0, inf}, {2}));
  opt->step(kLr[1], torch::ones({1}));
  expect_identical(snapshot(*opt, params), before);

  // The skipped step left no trace: the next clean step is the reference's second step.
  const Vec w0 = values(tensor({0.5, -1.0, 2.0, 0.25}, {2, 2}));
  set_grad(tp.w, tensor(kGradW[1], {2, 2}));
  set_grad(tp.b, tensor(kGradB[1], {2}));
  opt->step(kLr[1], torch::zeros({}));
  expect_close(values(tp.w), adamw_reference(w0, kGradW, 0.1), 1e-6);
}

// stability.update_gate device: a step the gate held back and the guard then applies is queued a
// second time without the gate. The two must equal the one step an ungated update makes.
void expect_held_back_step_equals_one_step(const config::OptimConfig& cfg) {
  TwoParams held, direct;
  auto a = make_optimizer(held.groups(cfg), cfg);
  auto b = make_optimizer(direct.groups(cfg), cfg);
  for (size_t t = 0; t < 2; ++t) {
    for (auto* tp : {&held, &direct}) {
      set_grad(tp->w, tensor(kGradW[t], {2, 2}));
      set_grad(tp->b, tensor(kGradB[t], {2}));
    }
    a->step(kLr[t], torch::ones({1}));   // held back by the gate
    a->step(kLr[t], torch::zeros({1}));  // applied after the guard's verdict
    b->step(kLr[t], torch::zeros({1}));
  }
  expect_identical(snapshot(*a, {held.w, held.b}), snapshot(*b, {direct.w, direct.b}));
}

TEST_P(AdamWPathTest, AStepHeldBackThenAppliedEqualsOneStep) {
  expect_held_back_step_equals_one_step(adamw_cfg(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(FusedAndForeach, AdamWPathTest, ::testing::Values("on", "off"));

TEST(AdamWTest, FusedAndForeachAgree) {
  torch::manual_seed(0);
  const std::vector<std::vector<int64_t>> shapes = {{16, 8}, {8}, {3, 5, 7}, {1}};
  std::vector<Tensor> a, b;
  std::vector<std::pair<std::string, Tensor>> na, nb;
  for (size_t i = 0; i < shapes.size(); ++i) {
    a.push_back(torch::randn(shapes[i]).requires_grad_(true));
    b.push_back(a.back().detach().clone().requires_grad_(true));
    na.emplace_back("p" + std::to_string(i), a.back());
    nb.emplace_back("p" + std::to_string(i), b.back());
  }
  auto fused = make_optimizer(make_param_groups(na, adamw_cfg("on")), adamw_cfg("on"));
  auto foreach = make_optimizer(make_param_groups(nb, adamw_cfg("off")), adamw_cfg("off"));
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const auto g = torch::randn(shapes[i]);
      set_grad(a[i], g);
      set_grad(b[i], g);
    }
    fused->step(1e-2 * (step + 1));
    foreach
      ->step(1e-2 * (step + 1));
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "param " << i;
  }
  const auto sa = fused->state_dict(), sb = foreach->state_dict();
  for (const auto& [k, t] : sa) EXPECT_TRUE(torch::allclose(t, sb.at(k), 1e-5, 1e-7)) << k;
}

TEST(AdamWTest, AutoPicksFusedForFp32Cpu) {
  TwoParams tp;
  const auto cfg = adamw_cfg("auto");
  EXPECT_EQ(make_optimizer(tp.groups(cfg), cfg)->describe(), "adamw(fused)");
}

TEST(AdamWTest, FusedOnThrowsForNonFp32) {
  auto p = torch::zeros({2, 2}, torch::kDouble).requires_grad_(true);
  const auto cfg = adamw_cfg("on");
  EXPECT_THROW(make_optimizer(make_param_groups({{"w", p}}, cfg), cfg), ConfigError);
}

TEST(AdamWTest, StateIsFp32ForNonFp32Params) {
  auto p = torch::ones({2, 2}, torch::kDouble).requires_grad_(true);
  const auto cfg = adamw_cfg("auto");  // falls back to foreach
  auto opt = make_optimizer(make_param_groups({{"w", p}}, cfg), cfg);
  EXPECT_EQ(opt->describe(), "adamw(foreach)");
  set_grad(p, torch::ones({2, 2}, torch::kDouble));
  opt->step(0.1);
  EXPECT_EQ(opt->state_dict().at("group0.param0.exp_avg").scalar_type(), torch::kFloat);
  EXPECT_LT(p.max().item<double>(), 1.0);  // the update reached the double-precision parameter
}

TEST(AdamWTest, StateDictRoundTripAndShapeCheck) {
  TwoParams tp;
  const auto cfg = adamw_cfg("auto");
  auto opt = make_optimizer(tp.groups(cfg), cfg);
  set_grad(tp.w, tensor(kGradW[0], {2, 2}));
  set_grad(tp.b, tensor(kGradB[0], {2}));
  opt->step(0.01);
  std::map<std::string, Tensor> saved;
  for (const auto& [k, t] : opt->state_dict()) saved[k] = t.clone();
  EXPECT_EQ(saved.size(), 6u);  // group{0,1}.step, group{0,1}.param0.{exp_avg,exp_avg_sq}
  EXPECT_TRUE(saved.count("group1.param0.exp_avg_sq"));

  TwoParams other;
  auto fresh = make_optimizer(other.groups(cfg), cfg);
  fresh->load_state_dict(saved);
  for (const auto& [k, t] : fresh->state_dict()) EXPECT_TRUE(torch::equal(t, saved.at(k))) << k;

  auto bad_shape = saved;
  bad_shape["group0.param0.exp_avg"] = torch::zeros({4});
  EXPECT_THROW(fresh->load_state_dict(bad_shape), CheckpointError);
  auto missing = saved;
  missing.erase("group1.step");
  EXPECT_THROW(fresh->load_state_dict(missing), CheckpointError);
  auto extra = saved;
  extra["group2.step"] = torch::zeros({});
  EXPECT_THROW(fresh->load_state_dict(extra), CheckpointError);
}

TEST(OptimizerTest, ZeroGradResetsGradients) {
  TwoParams tp;
  const auto cfg = adamw_cfg("auto");
  auto opt = make_optimizer(tp.groups(cfg), cfg);
  set_grad(tp.w, torch::ones({2, 2}));
  opt->zero_grad();
  EXPECT_FALSE(tp.w.grad().defined());
}

// ---- Lion --------------------------------------------------------------------------------------
config::OptimConfig lion_cfg() {
  config::OptimConfig c;
  c.name = config::OptimizerName::kLion;
  c.betas = {0.9, 0.99};
  c.weight_decay = 0.1;
  return c;
}

// c = b1 m + (1-b1) g; p = p (1 - lr wd) - lr sign(c); m = b2 m + (1-b2) g.
Vec lion_reference(Vec p, const std::vector<Vec>& grads, double wd) {
  const double b1 = 0.9, b2 = 0.99;
  Vec m(p.size(), 0.0);
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[t][i], c = b1 * m[i] + (1 - b1) * g;
      p[i] = p[i] * (1 - kLr[t] * wd) - kLr[t] * ((c > 0) - (c < 0));
      m[i] = b2 * m[i] + (1 - b2) * g;
    }
  }
  return p;
}

TEST(LionTest, MatchesClosedForm) {
  TwoParams tp;
  auto opt = make_optimizer(tp.groups(lion_cfg()), lion_cfg());
  EXPECT_EQ(opt->describe(), "lion(foreach)");
  const Vec w0 = values(tp.w), b0 = values(tp.b);
  // Second step's w grads flip sign against the momentum on some elements.
  const std::vector<Vec> gw = {{0.1, -0.2, 0.3, 1.5}, {-2.0, 0.05, 0.2, -0.1}};
  for (size_t t = 0; t < 2; ++t) {
    set_grad(tp.w, tensor(gw[t], {2, 2}));
    set_grad(tp.b, tensor(kGradB[t], {2}));
    opt->step(kLr[t]);
  }
  expect_close(values(tp.w), lion_reference(w0, gw, 0.1), 1e-6);
  expect_close(values(tp.b), lion_reference(b0, kGradB, 0.0), 1e-6);
}

TEST(LionTest, FoundInfSkipsStepBitIdentically) {
  TwoParams tp;
  auto opt = make_optimizer(tp.groups(lion_cfg()), lion_cfg());
  set_grad(tp.w, tensor(kGradW[0], {2, 2}));
  set_grad(tp.b, tensor(kGradB[0], {2}));
  opt->step(0.01);
  const auto before = snapshot(*opt, {tp.w, tp.b});
  set_grad(tp.w, tensor({std::nan(""), 1.0, 1.0, 1.0}, {2, 2}));
  set_grad(tp.b, tensor({1.0, std::numeric_limits<double>::infinity()}, {2}));
  opt->step(0.01, torch::ones({1}));
  expect_identical(snapshot(*opt, {tp.w, tp.b}), before);
}

TEST(LionTest, AStepHeldBackThenAppliedEqualsOneStep) {
  expect_held_back_step_equals_one_step(lion_cfg());
}

// ---- parameter groups --------------------------------------------------------------------------
TEST(ParamGroupsTest, NormBiasEmbeddingAndOneDimGoToNoDecay) {
  config::ModelConfig mc;
  mc.arch = config::Arch::kGpt2;
  mc.vocab_size = 32;
  mc.d_model = 16;
  mc.n_layers = 1;
  mc.n_heads = 2;
  mc.seq_len = 8;
  mc.tie_embeddings = false;
  model::Transformer m(mc);
  std::vector<std::pair<std::string, Tensor>> named;
  for (const auto& item : m->named_parameters()) named.emplace_back(item.key(), item.value());
  named.emplace_back("layers.0.scale", torch::ones({4}, torch::requires_grad()));  // 1-D
  const auto groups = make_param_groups(named, lion_cfg());
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_DOUBLE_EQ(groups[0].weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(groups[1].weight_decay, 0.0);
  const auto& decay = groups[0].names;
  const auto& no_decay = groups[1].names;
  auto in = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (const char* n :
       {"tok_emb.weight", "pos_emb.weight", "layers.0.attn_norm.weight", "layers.0.attn_norm.bias",
        "layers.0.attn.qkv.bias", "final_norm.weight", "layers.0.scale"}) {
    EXPECT_TRUE(in(no_decay, n)) << n;
  }
  for (const char* n : {"layers.0.attn.qkv.weight", "layers.0.attn.proj.weight",
                        "layers.0.mlp.fc.weight", "layers.0.mlp.proj.weight", "lm_head.weight"}) {
    EXPECT_TRUE(in(decay, n)) << n;
  }
  EXPECT_EQ(decay.size() + no_decay.size(), named.size());
}

// ---- clipping ----------------------------------------------------------------------------------
std::vector<Tensor> params_with_grads(const std::vector<Vec>& grads) {
  std::vector<Tensor> ps;
  for (const auto& g : grads) {
    ps.push_back(torch::zeros({static_cast<int64_t>(g.size())}, torch::requires_grad()));
    set_grad(ps.back(), tensor(g, {static_cast<int64_t>(g.size())}));
  }
  return ps;
}

TEST(ClipTest, ScalesExactlyToMaxNormAndReportsNormBefore) {
  auto ps = params_with_grads({{3.0, 4.0}, {12.0}});  // global norm 13
  const auto norm = clip_grad_norm_(ps, 1.0);
  EXPECT_NEAR(norm.item<double>(), 13.0, 1e-5);
  EXPECT_NEAR(global_grad_norm(ps).item<double>(), 1.0, 1e-5);
  expect_close(values(ps[0].grad()), {3.0 / 13, 4.0 / 13}, 1e-6);
  expect_close(values(ps[1].grad()), {12.0 / 13}, 1e-6);
}

TEST(ClipTest, LeavesSmallGradientsUnchanged) {
  auto ps = params_with_grads({{0.3, 0.4}, {0.0}});  // norm 0.5 < 1
  const auto before = ps[0].grad().clone();
  EXPECT_NEAR(clip_grad_norm_(ps, 1.0).item<double>(), 0.5, 1e-6);
  EXPECT_TRUE(torch::equal(ps[0].grad(), before));
}

TEST(ClipTest, PerParamNormsKeepOrderWithZerosForMissingGrads) {
  auto ps = params_with_grads({{3.0, 4.0}, {1.0}});
  ps.insert(ps.begin() + 1, torch::zeros({3}, torch::requires_grad()));  // no grad
  const auto norms = per_param_grad_norms(ps);
  expect_close(values(norms), {5.0, 0.0, 1.0}, 1e-6);
  EXPECT_NEAR(global_grad_norm(ps).item<double>(), std::sqrt(26.0), 1e-5);
  // The trainer takes the global norm from the per-parameter ones and clips with it.
  EXPECT_NEAR(norms.norm().item<double>(), std::sqrt(26.0), 1e-5);
  clip_grad_norm_(ps, 1.0, norms.norm());
  EXPECT_NEAR(global_grad_norm(ps).item<double>(), 1.0, 1e-5);
}

}  // namespace
}  // namespace keel::optim
