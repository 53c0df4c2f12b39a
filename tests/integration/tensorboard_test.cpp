// TensorBoard event files, read back by TensorBoard's own EventAccumulator (the `tensorboard`
// package scripts/setup.sh installs): the scalars equal metrics.jsonl's and eval.jsonl's, guard and
// run events are texts, and a resumed run's replayed steps replace the abandoned ones.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "harness.h"

namespace keel::testing {
namespace {

// What tests/tools/read_tensorboard.py reads from run_dir/tensorboard with TensorBoard's reader.
nlohmann::json read_tensorboard(const std::filesystem::path& run_dir) {
  const std::string python = setup_env_program("python");
  EXPECT_FALSE(python.empty()) << "no Python environment from scripts/setup.sh";
  auto r = run_shell(python + " " + source_path("tests/tools/read_tensorboard.py") + " " +
                     run_dir.string() + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

// Crashes at step 25 (checkpoint at 20) and resumes: steps 21-25 are trained twice, and
// TensorBoard shows the second time only, with the numbers metrics.jsonl holds last for each step.
TEST(TensorBoardIntegration, ScalarsAndTextsEqualTheRecordAcrossAResume) {
  ScratchDir d("tensorboard_run");
  const std::string args =
      "train" + kQuickRun + " --run-dir " + d.str() +
      " --set run.max_steps=40 --set logging.every_steps=5"
      " --set logging.tensorboard=true --set logging.tensorboard_every_steps=10"
      " --set eval.every_steps=20 --set checkpoint.every_steps=10";
  auto r = run_keel(args + " --set 'faults=[{kind: crash, at_step: 25}]'");
  ASSERT_NE(r.exit_code, 0) << r.output;
  r = run_keel(args + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto tb = read_tensorboard(d.path());
  // The last metrics line of each step; only every tensorboard_every_steps-th step goes over.
  std::map<int64_t, nlohmann::json> last;
  for (auto& m : read_jsonl(d.path() / "metrics.jsonl")) last[m["step"].get<int64_t>()] = m;
  ASSERT_TRUE(tb.contains("scalars") && tb.contains("texts"));
  const auto& scalars = tb["scalars"];
  for (const char* key : {"loss", "lr", "grad_norm", "grad_norm_median", "clip_rate",
                          "update_ratio", "tokens_per_s", "tokens_seen", "loader_wait_ms"}) {
    const std::string tag = std::string("train/") + key;
    ASSERT_TRUE(scalars.contains(tag)) << tag << " in " << scalars.dump().substr(0, 400);
    std::set<int64_t> steps;
    for (const auto& point : scalars[tag]) {
      const int64_t step = point[0].get<int64_t>();
      EXPECT_TRUE(steps.insert(step).second) << tag << ": step " << step << " twice";
      EXPECT_EQ(step % 10, 0) << tag;
      ASSERT_TRUE(last.count(step)) << tag << " " << step;
      EXPECT_EQ(point[1].get<double>(),
                static_cast<double>(static_cast<float>(last[step][key].get<double>())))
          << tag << " at step " << step;
    }
    EXPECT_EQ(steps, (std::set<int64_t>{10, 20, 30, 40})) << tag;
  }
  EXPECT_TRUE(scalars.contains("train/grad_norm_layers/layers.0"));
  const auto evals = read_jsonl(d.path() / "eval.jsonl");
  ASSERT_FALSE(evals.empty());
  ASSERT_TRUE(scalars.contains("val/val_loss"));
  EXPECT_EQ(scalars["val/val_loss"].back()[1].get<double>(),
            static_cast<double>(static_cast<float>(evals.back()["val_loss"].get<double>())));
  // Events are texts: the run's start, the resume (and its step), the end.
  const auto& texts = tb["texts"];
  for (const char* kind : {"events/run_start", "events/resume", "events/run_end"})
    ASSERT_TRUE(texts.contains(kind)) << kind << " in " << texts.dump().substr(0, 400);
  EXPECT_NE(texts["events/resume"][0][1].get<std::string>().find("\"from_step\":20"),
            std::string::npos);
}

TEST(TensorBoardIntegration, AnEveryStepsThatMissesTheLogIsAConfigError) {
  auto r = run_keel(
      "validate --set logging.tensorboard=true --set logging.every_steps=10"
      " --set logging.tensorboard_every_steps=25");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("logging.tensorboard_every_steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("use 20 or 30"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
