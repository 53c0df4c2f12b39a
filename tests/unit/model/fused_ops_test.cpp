#include "model/fused_ops.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace keel::model {
namespace {

// Forward value and the gradient of a weighted sum through `op`.
std::pair<torch::Tensor, torch::Tensor> value_and_grad(torch::Tensor (*op)(const torch::Tensor&),
                                                       const torch::Tensor& input,
                                                       const torch::Tensor& weights) {
  auto x = input.detach().clone().requires_grad_(true);
  auto y = op(x);
  (y * weights).sum().backward();
  return {y.detach(), x.grad()};
}

TEST(FusedOps, SwigluMatchesTheCompositeForwardAndBackward) {
  torch::manual_seed(3);
  // F = 45: five full 8-lane vectors and a scalar tail per row; large values reach the tails of
  // the sigmoid (and its exp overflow) on both sides.
  for (int64_t f : {45, 896}) {
    auto input = torch::randn({3, 7, 2 * f}) * 4.0;
    input.index_put_({0, 0, 0}, 95.0);
    input.index_put_({0, 0, 1}, -95.0);
    auto weights = torch::randn({3, 7, f});
    if (!swiglu_is_fused(input)) GTEST_SKIP() << "no AVX2+FMA on this CPU: swiglu is the composite";
    const auto [y, dx] = value_and_grad(&swiglu, input, weights);
    const auto [y_ref, dx_ref] = value_and_grad(&swiglu_composite, input, weights);
    EXPECT_EQ(y.sizes(), y_ref.sizes());
    EXPECT_TRUE(torch::allclose(y, y_ref, /*rtol=*/1e-5, /*atol=*/1e-6)) << (y - y_ref).abs().max();
    EXPECT_TRUE(torch::allclose(dx, dx_ref, 1e-5, 1e-6)) << (dx - dx_ref).abs().max();
    EXPECT_TRUE(torch::isfinite(dx).all().item<bool>());
  }
}

TEST(FusedOps, SwigluTakesTheCompositeWhereTheKernelDoesNotApply) {
  auto strided = torch::randn({4, 16}).t();  // not contiguous
  EXPECT_FALSE(swiglu_is_fused(strided));
  EXPECT_FALSE(swiglu_is_fused(torch::randn({4, 16}, torch::kDouble)));
  EXPECT_FALSE(swiglu_is_fused(torch::randn({4, 15})));
  auto y = swiglu(strided);
  EXPECT_TRUE(torch::equal(y, swiglu_composite(strided)));
  auto bf16 = torch::randn({2, 8}).to(torch::kBFloat16);
  EXPECT_EQ(swiglu(bf16).scalar_type(), torch::kBFloat16);
}

TEST(FusedOps, OneDnnLinearMatchesAtLinearForwardAndGradients) {
  if (!onednn_linear_available()) GTEST_SKIP() << "this LibTorch has no oneDNN";
  torch::manual_seed(13);
  set_cpu_matmul(CpuMatmul::kOneDnn);
  for (bool with_bias : {false, true}) {
    const auto input = torch::randn({3, 7, 40});
    const auto w0 = torch::randn({24, 40}) * 0.2, b0 = torch::randn({24});
    const auto weights = torch::randn({3, 7, 24});
    ASSERT_TRUE(linear_uses_onednn(input, w0, with_bias ? b0 : torch::Tensor()));
    auto run = [&](bool onednn) {
      auto x = input.clone().requires_grad_(true);
      auto w = w0.clone().requires_grad_(true);
      auto b = with_bias ? b0.clone().requires_grad_(true) : torch::Tensor();
      auto y = onednn ? model::linear(x, w, b) : at::linear(x, w, b);
      (y * weights).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(),
                                        with_bias ? b.grad() : torch::zeros({1})};
    };
    const auto fused = run(true), ref = run(false);
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_TRUE(torch::allclose(fused[i], ref[i], 1e-5, 1e-5))
          << i << ": " << (fused[i] - ref[i]).abs().max();
    }
  }
  // A strided input (attention's output, transposed back) is made contiguous, not refused.
  const auto strided = torch::randn({7, 3, 40}).transpose(0, 1);
  EXPECT_TRUE(torch::allclose(model::linear(strided, torch::ones({5, 40})),
                              at::linear(strided, torch::ones({5, 40})), 1e-5, 1e-5));
}

TEST(FusedOps, LinearStaysOnAtenWhereOneDnnDoesNotApply) {
  const auto x = torch::randn({4, 8}), w = torch::randn({3, 8});
  set_cpu_matmul(CpuMatmul::kAten);
  EXPECT_FALSE(linear_uses_onednn(x, w));
  set_cpu_matmul(CpuMatmul::kOneDnn);
  EXPECT_FALSE(linear_uses_onednn(x.to(torch::kDouble), w.to(torch::kDouble)));
  EXPECT_FALSE(linear_uses_onednn(x, w.t().contiguous().t()));  // a strided weight
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    EXPECT_FALSE(linear_uses_onednn(x, w)) << "autocast decides the dtype: at::linear";
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
  EXPECT_TRUE(torch::equal(model::linear(x.to(torch::kDouble), w.to(torch::kDouble)),
                           at::linear(x.to(torch::kDouble), w.to(torch::kDouble))));
}

TEST(FusedOps, RmsNormMatchesTheCompositeForwardAndBothGradients) {
  torch::manual_seed(7);
  // n = 45: vectors and a scalar tail; rows not a multiple of the thread count; a zero row.
  for (int64_t n : {45, 320}) {
    auto input = torch::randn({3, 7, n}) * 3.0;
    input[1][2].zero_();
    const auto gain = torch::rand({n}) + 0.5;
    const auto weights = torch::randn({3, 7, n});
    if (!rms_norm_is_fused(input, gain)) GTEST_SKIP() << "no AVX2+FMA on this CPU";
    auto run = [&](bool fused) {
      auto x = input.clone().requires_grad_(true);
      auto w = gain.clone().requires_grad_(true);
      auto y = fused ? rms_norm(x, w, 1e-5) : rms_norm_composite(x, w, 1e-5);
      (y * weights).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
    };
    const auto fused = run(true), ref = run(false);
    EXPECT_TRUE(torch::allclose(fused[0], ref[0], 1e-5, 1e-6)) << (fused[0] - ref[0]).abs().max();
    EXPECT_TRUE(torch::allclose(fused[1], ref[1], 1e-4, 1e-5)) << (fused[1] - ref[1]).abs().max();
    EXPECT_TRUE(torch::allclose(fused[2], ref[2], 1e-4, 1e-4)) << (fused[2] - ref[2]).abs().max();
  }
  EXPECT_FALSE(rms_norm_is_fused(torch::randn({4, 8}), torch::ones({7})));
  EXPECT_FALSE(rms_norm_is_fused(torch::randn({4, 8}).to(torch::kBFloat16), torch::ones({8})));
}

// q, k, v of split_qkv_rope(_composite) and the gradient of qkv under a weighted sum of all three.
struct HeadsAndGrad {
  QkvHeads heads;
  torch::Tensor grad;
};
HeadsAndGrad heads_and_grad(bool fused, const torch::Tensor& qkv, const torch::Tensor& cos,
                            const torch::Tensor& sin, int64_t h, int64_t hkv,
                            const std::vector<torch::Tensor>& weights, bool use_k = true) {
  auto x = qkv.detach().clone().requires_grad_(true);
  auto heads =
      fused ? split_qkv_rope(x, cos, sin, h, hkv) : split_qkv_rope_composite(x, cos, sin, h, hkv);
  auto loss = (heads.q * weights[0]).sum() + (heads.v * weights[2]).sum();
  if (use_k) loss = loss + (heads.k * weights[1]).sum();
  loss.backward();
  return {{heads.q.detach(), heads.k.detach(), heads.v.detach()}, x.grad()};
}

TEST(FusedOps, SplitQkvRopeMatchesTheCompositeForwardAndBackward) {
  torch::manual_seed(5);
  // D = 64 (four vectors per half) and D = 20 (one vector and a scalar tail); with and without GQA;
  // tables longer than the sequence, as the model's are.
  struct Shape {
    int64_t b, t, h, hkv, d;
  };
  for (const Shape& sh : {Shape{2, 9, 4, 4, 64}, Shape{3, 5, 6, 2, 20}}) {
    const int64_t half = sh.d / 2;
    const auto angles = torch::rand({sh.t + 3, half}) * 6.28;
    const auto cos = angles.cos(), sin = angles.sin();
    const auto qkv = torch::randn({sh.b, sh.t, (sh.h + 2 * sh.hkv) * sh.d});
    if (!split_qkv_rope_is_fused(qkv, cos, sin, sh.h, sh.hkv)) {
      GTEST_SKIP() << "no AVX2+FMA on this CPU: split_qkv_rope is the composite";
    }
    // q's gradient arrives strided, as attention's output layout makes it; k's and v's contiguous.
    const std::vector<torch::Tensor> w = {torch::randn({sh.b, sh.t, sh.h, sh.d}).transpose(1, 2),
                                          torch::randn({sh.b, sh.hkv, sh.t, sh.d}),
                                          torch::randn({sh.b, sh.hkv, sh.t, sh.d})};
    for (bool use_k : {true, false}) {  // false: k's gradient is undefined, the kernel writes zeros
      const auto fused = heads_and_grad(true, qkv, cos, sin, sh.h, sh.hkv, w, use_k);
      const auto ref = heads_and_grad(false, qkv, cos, sin, sh.h, sh.hkv, w, use_k);
      EXPECT_TRUE(fused.heads.q.is_contiguous());
      EXPECT_EQ(fused.heads.k.sizes(), (std::vector<int64_t>{sh.b, sh.hkv, sh.t, sh.d}));
      EXPECT_TRUE(torch::allclose(fused.heads.q, ref.heads.q, 1e-5, 1e-6));
      EXPECT_TRUE(torch::allclose(fused.heads.k, ref.heads.k, 1e-5, 1e-6));
      EXPECT_TRUE(torch::equal(fused.heads.v, ref.heads.v));
      EXPECT_TRUE(torch::allclose(fused.grad, ref.grad, 1e-5, 1e-6))
          << (fused.grad - ref.grad).abs().max();
    }
  }
}

TEST(FusedOps, CausalAttentionMatchesSdpaForwardAndBackward) {
  torch::manual_seed(11);
  // T = 13: rows of every length mod 8; D = 64 and 20; one batch with huge scores, whose
  // exponentials underflow to zero and must not turn into NaN.
  struct Shape {
    int64_t b, h, t, d;
    double amplitude;
  };
  for (const Shape& sh :
       {Shape{2, 3, 13, 64, 1.0}, Shape{1, 2, 40, 20, 1.0}, Shape{1, 1, 9, 8, 60.0}}) {
    std::vector<torch::Tensor> inputs;
    for (int i = 0; i < 3; ++i)
      inputs.push_back(torch::randn({sh.b, sh.t, sh.h, sh.d}).transpose(1, 2) * sh.amplitude);
    const auto weights = torch::randn({sh.b, sh.h, sh.t, sh.d});
    if (!causal_attention_is_fused(inputs[0], inputs[1], inputs[2], 0.0)) {
      GTEST_SKIP() << "no AVX2+FMA on this CPU: causal_attention is SDPA";
    }
    auto run = [&](bool fused) {
      std::vector<torch::Tensor> x;
      for (const auto& t : inputs) x.push_back(t.detach().clone().requires_grad_(true));
      auto y = fused ? causal_attention(x[0], x[1], x[2], 0.0)
                     : at::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true);
      (y * weights).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), x[0].grad(), x[1].grad(), x[2].grad()};
    };
    const auto fused = run(true), ref = run(false);
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_TRUE(torch::isfinite(fused[i]).all().item<bool>()) << i;
      const double tol = sh.amplitude > 1 ? 1e-3 : 1e-5;  // |scores| ~ 1e4 there: float rounding
      EXPECT_TRUE(torch::allclose(fused[i], ref[i], tol, tol))
          << "output " << i << ": " << (fused[i] - ref[i]).abs().max();
    }
  }
}

TEST(FusedOps, CausalAttentionTakesSdpaWhereTheKernelDoesNotApply) {
  const auto q = torch::randn({1, 2, 16, 8});
  EXPECT_FALSE(causal_attention_is_fused(q, q, q, /*dropout_p=*/0.1));
  EXPECT_FALSE(causal_attention_is_fused(q.to(torch::kDouble), q, q, 0.0));
  EXPECT_FALSE(causal_attention_is_fused(q, q.narrow(2, 0, 8), q.narrow(2, 0, 8), 0.0));
  const auto long_seq = torch::randn({1, 1, kMaxAttentionSeq + 1, 8});
  EXPECT_FALSE(causal_attention_is_fused(long_seq, long_seq, long_seq, 0.0));
  const auto many_heads = torch::randn({1, kMaxAttentionProbsBytes / (4 * 512 * 512) + 1, 512, 1});
  EXPECT_FALSE(causal_attention_is_fused(many_heads, many_heads, many_heads, 0.0));
}

TEST(FusedOps, SplitQkvRopeTakesTheCompositeWhereTheKernelDoesNotApply) {
  const auto cos = torch::ones({8, 4}), sin = torch::zeros({8, 4});
  const auto qkv = torch::randn({2, 8, 3 * 8});
  const bool cpu_has_kernels = swiglu_is_fused(torch::randn({2}));
  EXPECT_EQ(split_qkv_rope_is_fused(qkv, cos, sin, 1, 1), cpu_has_kernels);
  EXPECT_FALSE(split_qkv_rope_is_fused(qkv.to(torch::kDouble), cos, sin, 1, 1));
  EXPECT_FALSE(
      split_qkv_rope_is_fused(torch::randn({2, 9, 24}), cos, sin, 1, 1));  // table too short
  EXPECT_FALSE(split_qkv_rope_is_fused(qkv, cos, sin, 2, 1));  // 24 is not 4 heads of an even dim
  EXPECT_FALSE(split_qkv_rope_is_fused(torch::randn({8, 2, 24}).transpose(0, 1), cos, sin, 1, 1));
  // cos 1, sin 0 is the identity rotation, whichever path runs.
  const auto heads = split_qkv_rope(qkv, cos, sin, 1, 1);
  EXPECT_TRUE(torch::equal(heads.q, qkv.narrow(2, 0, 8).view({2, 8, 1, 8}).transpose(1, 2)));
}

}  // namespace
}  // namespace keel::model
