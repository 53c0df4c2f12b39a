// run.cuda_graphs: what keeps a run's micro-batches out of a CUDA graph, said by the key that
// does. The capture itself needs a CUDA device (scripts/gpu_check.sh compares graphs on and off).
#include "train/micro_graph.h"

#include <gtest/gtest.h>

namespace keel::train {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

TEST(GraphObstacle, AOneRankCudaRunOfTheDefaultsCanBeCaptured) {
  const config::Config cfg;
  EXPECT_EQ(graph_obstacle(cfg, kCuda, 1), "");
}

TEST(GraphObstacle, EachFeatureAGraphCannotHoldIsNamed) {
  const config::Config defaults;
  EXPECT_NE(graph_obstacle(defaults, torch::kCPU, 1).find("not on a CUDA device"),
            std::string::npos);
  EXPECT_NE(graph_obstacle(defaults, kCuda, 2).find("several ranks"), std::string::npos);

  config::Config zero = defaults;
  zero.distributed.zero = 1;
  EXPECT_NE(graph_obstacle(zero, kCuda, 1).find("distributed.zero: 1"), std::string::npos);

  config::Config low = defaults;
  low.stability.screen.low = config::LowScreen::kQuarantine;
  EXPECT_NE(graph_obstacle(low, kCuda, 1).find("stability.screen.low"), std::string::npos);

  config::Config recompute = defaults;
  recompute.model.activation_checkpointing = config::ActivationCheckpointing::kFull;
  EXPECT_EQ(graph_obstacle(recompute, kCuda, 1), "");  // no randomness to replay
  recompute.model.dropout = 0.1;
  EXPECT_NE(graph_obstacle(recompute, kCuda, 1).find("model.activation_checkpointing"),
            std::string::npos);
}

}  // namespace
}  // namespace keel::train
