// `keel train --profile STEPS` (monitor/step_profiler.h): the trace holds exactly the steps asked
// for, after the start's first two, with the trainer's stages and LibTorch's operators in them,
// and recording changes nothing about the training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "harness.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

TEST(Profile, RecordsTheAskedStepsWithTheirStagesAndChangesNoLoss) {
  ScratchDir dir("profile");
  const std::string run = kQuickRun + " --set run.max_steps=10 --set data.grad_accum_steps=2";
  auto r = run_keel("train --run-dir " + (dir / "profiled") + run + " --profile 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path trace = dir.path() / "profiled/profile/rank0_steps_3-5.json";
  ASSERT_TRUE(fs::exists(trace)) << r.output;
  EXPECT_NE(r.output.find("profile written to " + trace.string()), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--profile 3: this start has"), std::string::npos) << r.output;
  // A CPU run: no word of Kineto's CUDA probe (issue 52: once per rank, "code 35").
  EXPECT_EQ(r.output.find("gpuGetDeviceCount"), std::string::npos) << r.output;

  std::ifstream in(trace);
  const auto json = nlohmann::json::parse(in);
  std::map<std::string, int> count;
  for (const auto& e : json.at("traceEvents"))
    if (e.contains("name") && e["name"].is_string()) ++count[e["name"].get<std::string>()];
  EXPECT_EQ(count["keel/step"], 3);
  EXPECT_EQ(count["keel/data"], 6);  // two micro-batches a step
  EXPECT_EQ(count["keel/forward"], 6);
  EXPECT_EQ(count["keel/backward"], 6);
  EXPECT_EQ(count["keel/guard"], 3);
  EXPECT_EQ(count["keel/optimizer"], 3);
  EXPECT_EQ(count["keel/checkpoint"], 3);
  EXPECT_GT(count["aten::mm"] + count["aten::addmm"] + count["aten::matmul"], 0);

  // More steps than the run has left: recorded from the first step, and said so.
  r = run_keel("train --run-dir " + (dir / "long") + run + " --profile 40");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() / "long/profile/rank0_steps_1-10.json")) << r.output;
  EXPECT_NE(r.output.find("--profile 40: this start has 10 step(s) left, so the trace records "
                          "all 10 of them, from the first"),
            std::string::npos)
      << r.output;

  r = run_keel("train --run-dir " + (dir / "plain") + run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "plain/profile"));
  const auto a = losses_by_step(dir.path() / "profiled"), b = losses_by_step(dir.path() / "plain");
  ASSERT_EQ(a.size(), 10u);
  EXPECT_EQ(a, b);

  r = run_keel("train --run-dir " + (dir / "refused") + run + " --profile 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--profile"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
