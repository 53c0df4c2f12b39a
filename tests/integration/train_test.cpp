#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "harness.h"

namespace keel::testing {
namespace {

// A short run of the tiny config: the loss falls, and the run directory holds the contract files.
TEST(TrainIntegration, TinyRunLearnsAndWritesRunFiles) {
  ScratchDir dir("train");
  auto r = run_keel("train " + source_path("configs/tiny.yaml") + " --run-dir " + dir.str() +
                    " --set run.max_steps=60 --set eval.every_steps=30 --set eval.batches=2"
                    " --set logging.every_steps=5 --set schedule.warmup_steps=10"
                    " --set logging.progress=off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto name : {"config.resolved.yaml", "metrics.jsonl", "events.jsonl", "eval.jsonl"})
    EXPECT_TRUE(std::filesystem::exists(dir.path() / name)) << name;

  auto metrics = read_jsonl(dir.path() / "metrics.jsonl");
  ASSERT_GE(metrics.size(), 10u);
  for (auto key : {"step", "loss", "lr", "grad_norm", "grad_norm_median", "clipped", "update_ratio",
                   "tokens_per_s", "loader_wait_ms", "queue_depth", "tokens_seen", "samples_seen"})
    EXPECT_TRUE(metrics.back().contains(key)) << key;
  EXPECT_EQ(metrics.back()["step"].get<int64_t>(), 60);
  EXPECT_EQ(metrics.back()["samples_seen"].get<int64_t>(), 60 * 16);
  double first = metrics.front()["loss"].get<double>();
  double last = metrics.back()["loss"].get<double>();
  EXPECT_GT(first, 5.0);         // ~ln(256) at initialisation
  EXPECT_LT(last, first - 1.0);  // visibly learning

  auto evals = read_jsonl(dir.path() / "eval.jsonl");
  ASSERT_EQ(evals.size(), 3u);  // steps 0, 30, 60
  EXPECT_EQ(evals[0]["step"].get<int64_t>(), 0);
  EXPECT_EQ(evals[2]["step"].get<int64_t>(), 60);
  EXPECT_NEAR(evals[2]["floor"].get<double>(), 1.8158479, 1e-6);
  EXPECT_LT(evals[2]["val_loss"].get<double>(), evals[0]["val_loss"].get<double>() - 1.0);

  // The resolved config records the overrides and validates on its own.
  auto v = run_keel("validate " + (dir.path() / "config.resolved.yaml").string());
  EXPECT_EQ(v.exit_code, 0) << v.output;
}

TEST(TrainIntegration, GradientAccumulationKeepsSampleAccounting) {
  ScratchDir dir("accum");
  auto r =
      run_keel("train " + source_path("configs/tiny.yaml") + " --run-dir " + dir.str() +
               " --set run.max_steps=4 --set data.micro_batch_size=4"
               " --set data.grad_accum_steps=3 --set eval.batches=1 --set logging.every_steps=1"
               " --set schedule.warmup_steps=1 --set logging.progress=off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto metrics = read_jsonl(dir.path() / "metrics.jsonl");
  ASSERT_EQ(metrics.size(), 4u);
  EXPECT_EQ(metrics.back()["samples_seen"].get<int64_t>(), 4 * 4 * 3);
  EXPECT_EQ(metrics.back()["tokens_seen"].get<int64_t>(), 4 * 4 * 3 * 128);
}

// The caching host allocator changes where tensors live, never what is computed: the same run
// with LibTorch's default allocator gives the same losses and norms, bit for bit.
TEST(TrainIntegration, HostAllocatorDoesNotChangeTheRun) {
  std::vector<std::vector<nlohmann::json>> runs;
  for (auto allocator : {"caching", "system"}) {
    ScratchDir dir(std::string("alloc-") + allocator);
    auto r = run_keel("train " + source_path("configs/tiny.yaml") + " --run-dir " + dir.str() +
                      " --set run.max_steps=6 --set eval.batches=1 --set logging.every_steps=1"
                      " --set schedule.warmup_steps=1 --set logging.progress=off"
                      " --set run.host_allocator=" +
                      allocator);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs.push_back(read_jsonl(dir.path() / "metrics.jsonl"));
  }
  ASSERT_EQ(runs[0].size(), 6u);
  ASSERT_EQ(runs[1].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    for (auto key : {"loss", "grad_norm", "update_ratio"})
      EXPECT_EQ(runs[0][i][key].get<double>(), runs[1][i][key].get<double>())
          << key << " at record " << i;
  }
}

TEST(ValidateIntegration, ShippedConfigsAreValid) {
  for (auto name : {"configs/tiny.yaml"}) {
    auto r = run_keel("validate " + source_path(name));
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
  auto embedded = run_keel("validate");
  EXPECT_EQ(embedded.exit_code, 0) << embedded.output;
}

TEST(ValidateIntegration, ThreePlantedErrorsGiveThreeLocatedErrors) {
  ScratchDir dir("validate");
  auto path = dir.path() / "bad.yaml";
  write_file(path,
             "run:\n"
             "  max_steps: 100\n"
             "optim:\n"
             "  lr: 3.0e-4\n"
             "  grad_clip: 0\n"  // line 5: clip must be > 0
             "schedule:\n"
             "  warmup_steps: 10.5\n"  // line 7: integer required
             "model:\n"
             "  d_modle: 128\n");  // line 9: unknown key
  auto r = run_keel("validate " + path.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::regex located(path.string() + R"(:(\d+):(\d+): error: )");
  std::set<int> lines;
  int count = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), located), end; it != end; ++it) {
    lines.insert(std::stoi((*it)[1]));
    ++count;
  }
  EXPECT_EQ(count, 3) << r.output;
  EXPECT_EQ(lines, (std::set<int>{5, 7, 9})) << r.output;
  EXPECT_NE(r.output.find("d_model"), std::string::npos) << "did-you-mean missing:\n" << r.output;
}

TEST(CliIntegration, UserMistakesExitTwo) {
  EXPECT_EQ(run_keel("train --no-such-flag").exit_code, 2);
  EXPECT_EQ(run_keel("validate /nonexistent/config.yaml").exit_code, 2);
  auto r = run_keel("validate " + source_path("configs/tiny.yaml") + " --set optim.lrr=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("optim.lr"), std::string::npos) << r.output;
  // Numbers: the unit and the range, never CLI11's 300-digit range; sizes with their units.
  r = run_keel("train --profile 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--profile: '0' steps: give a whole number of steps, 1 or more"),
            std::string::npos)
      << r.output;
  r = run_keel("prepare --input x --output y --jobs -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("threads, 0 or more"), std::string::npos) << r.output;
  r = run_keel("validate --no-probe --device-memory 80GB");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("validate --no-probe --device-memory 80bananas");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("is not a size"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("1797693134862315"), std::string::npos) << r.output;
  // A mistyped flag: the command's own flag it resembles, or the config key and --set.
  r = run_keel("train --max-steps 20");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--set run.max_steps="), std::string::npos) << r.output;
  r = run_keel("prepare --inputs x --output y");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("did you mean --input?"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
