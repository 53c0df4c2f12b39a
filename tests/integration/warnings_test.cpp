// Warnings that mean something: clean training under the defaults raises none after warmup.
// (The fault scenarios that must still alarm are in resume_guard_test.cpp and record_test.cpp,
// and measured with their lead times by bench/stability/run.py.)
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include "harness.h"

namespace keel::testing {
namespace {

// The embedded default config, untouched but for the seed: what a user who launches keel gets.
// One test per seed, so that ctest runs the three 400-step runs side by side.
class WarningsIntegration : public ::testing::TestWithParam<int> {};

TEST_P(WarningsIntegration, CleanTinyRunsRaiseNoWarningAfterWarmup) {
  const int seed = GetParam();
  ScratchDir d("warnings_clean_" + std::to_string(seed));
  auto r = run_keel("train --set logging.progress=off --set run.seed=" + std::to_string(seed) +
                    " --run-dir " + d.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resolved = YAML::LoadFile((d.path() / "config.resolved.yaml").string());
  const int64_t warmup = resolved["schedule"]["warmup_steps"].as<int64_t>();
  ASSERT_GT(warmup, 0);
  int64_t cadence = 0;
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
    EXPECT_NE(e["kind"], "pause") << "seed " << seed << ": " << e.dump();
    EXPECT_NE(e["kind"], "screen") << "seed " << seed << ": " << e.dump();
    if (e["kind"] == "warn")
      EXPECT_LE(e["step"].get<int64_t>(), warmup) << "seed " << seed << ": " << e.dump();
    if (e["kind"] == "checkpoint_cadence") cadence = e["detail"]["every_steps"].get<int64_t>();
  }
  // The screen set nothing aside on clean data, and the default cadence was measured: periodic
  // checkpoints between 10 steps and an eighth of the run.
  EXPECT_TRUE(read_jsonl(d.path() / "quarantine.jsonl").empty()) << "seed " << seed;
  EXPECT_GE(cadence, 10) << "seed " << seed;
  EXPECT_LE(cadence, 50) << "seed " << seed;
  auto metrics = read_jsonl(d.path() / "metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(metrics.back()["step"], 400) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Seeds, WarningsIntegration, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace keel::testing
