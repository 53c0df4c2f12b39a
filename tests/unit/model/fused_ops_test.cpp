#include "model/fused_ops.h"

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

}  // namespace
}  // namespace keel::model
