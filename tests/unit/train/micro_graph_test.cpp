// run.cuda_graphs: what keeps a run's micro-batches out of a CUDA graph, said by the key that
// does. The capture itself needs a CUDA device (scripts/gpu_check.sh compares graphs on and off).
#include "train/micro_graph.h"

#include <gtest/gtest.h>

namespace keel::train {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

TEST(GraphObstacle, AOneRankCudaRunOfTheDefaultsCanBeCaptured) {
  const config::Config cfg;
  EXPECT_EQ(graph_obstacle(cfg, kCuda, false), "");
}

TEST(GraphObstacle, EachFeatureAGraphCannotHoldIsNamed) {
  const config::Config defaults;
  EXPECT_NE(graph_obstacle(defaults, torch::kCPU, false).find("not on a CUDA device"),
            std::string::npos);
  // A process group of any size, one rank included: its reducer's hooks run on the host.
  EXPECT_NE(graph_obstacle(defaults, kCuda, true).find("a process group"), std::string::npos);

  config::Config zero = defaults;
  zero.distributed.zero = 1;
  EXPECT_NE(graph_obstacle(zero, kCuda, false).find("distributed.zero: 1"), std::string::npos);

  config::Config low = defaults;
  low.stability.screen.low = config::LowScreen::kQuarantine;
  EXPECT_NE(graph_obstacle(low, kCuda, false).find("stability.screen.low"), std::string::npos);

  config::Config recompute = defaults;
  recompute.model.activation_checkpointing = config::ActivationCheckpointing::kFull;
  EXPECT_EQ(graph_obstacle(recompute, kCuda, false), "");  // no randomness to replay
  recompute.model.dropout = 0.1;
  EXPECT_NE(graph_obstacle(recompute, kCuda, false).find("model.activation_checkpointing"),
            std::string::npos);
}

}  // namespace
}  // namespace keel::train
