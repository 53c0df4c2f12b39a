// `keel validate`'s checkpoint cost estimate and `keel inspect`, against real checkpoints.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "harness.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;

const std::string kShortRun =
    " --set eval.batches=1 --set eval.every_steps=0 --set logging.progress=off"
    " --set schedule.warmup_steps=1";

uint64_t directory_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) total += entry.file_size();
  return total;
}

double parse_number(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return std::stod(m[1].str());
}

TEST(ValidateIntegration, CheckpointSizeEstimateMatchesARealCheckpoint) {
  ScratchDir dir("ckpt_estimate");
  const fs::path run_dir = dir.path() / "run";
  auto r = run_keel("train --run-dir " + run_dir.string() +
                    " --set run.max_steps=2 --set checkpoint.every_steps=2" + kShortRun);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const uint64_t actual = directory_bytes(run_dir / "checkpoints" / "step_00000002");

  auto v = run_keel("validate --set run.out_dir=" + dir.str() + " --set checkpoint.every_steps=50");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  const double estimated_mb = parse_number(v.output, R"(estimate: checkpoint ([0-9.]+) MB)");
  ASSERT_GT(estimated_mb, 0) << v.output;
  EXPECT_NEAR(estimated_mb * 1e6, static_cast<double>(actual), 0.05 * actual) << v.output;

  // The disk probe measured a write speed in the checkpoint directory's filesystem, and the share
  // of training time is a percentage.
  EXPECT_GT(parse_number(v.output, R"(write [0-9.]+ m?s at ([0-9.]+) GB/s \(measured)"), 0)
      << v.output;
  const double share = parse_number(v.output, R"(([0-9.]+)% of training time)");
  EXPECT_GE(share, 0) << v.output;
  EXPECT_LE(share, 100) << v.output;
  EXPECT_NE(v.output.find("every 50 steps"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("sync: the whole write"), std::string::npos) << v.output;
  // The probe leaves nothing behind.
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".keel-validate-probe"), std::string::npos);
}

TEST(ValidateIntegration, FrequentSynchronousCheckpointsWarnWithTheKeyLocation) {
  ScratchDir dir("ckpt_share");
  // A measured step of 0.1 ms against a multi-megabyte synchronous write every step: the save
  // dominates, and validate says so at the key, still exiting 0 (a warning, not an error).
  auto v = run_keel("validate --set run.out_dir=" + dir.str() +
                    " --set checkpoint.every_steps=1 --step-time 0.0001");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("given with --step-time"), std::string::npos) << v.output;
  EXPECT_GT(parse_number(v.output, R"(([0-9.]+)% of training time)"), 50) << v.output;
  EXPECT_NE(v.output.find("--set[2]: warning: checkpoint.every_steps: saving costs about"),
            std::string::npos)
      << v.output;
  EXPECT_NE(v.output.find("or set checkpoint.async: true"), std::string::npos) << v.output;

  // Async saves stall only for the host copy: a smaller share, and the text names the mode.
  auto a =
      run_keel("validate --set run.out_dir=" + dir.str() +
               " --set checkpoint.every_steps=1 --set checkpoint.async=true --step-time 0.0001");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("async: the copy to host memory"), std::string::npos) << a.output;

  auto n = run_keel("validate --set run.out_dir=" + dir.str() + " --no-probe");
  ASSERT_EQ(n.exit_code, 0) << n.output;
  EXPECT_NE(n.output.find("not measured (--no-probe)"), std::string::npos) << n.output;
  EXPECT_EQ(n.output.find("GB/s"), std::string::npos) << n.output;
}

TEST(InspectIntegration, ReportsStepAndVerificationAndNamesACorruptFile) {
  ScratchDir dir("inspect");
  auto r = run_keel("train --run-dir " + dir.str() +
                    " --set run.max_steps=4 --set checkpoint.every_steps=2" + kShortRun);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path checkpoints = dir.path() / "checkpoints";

  auto latest = run_keel("inspect " + checkpoints.string());
  ASSERT_EQ(latest.exit_code, 0) << latest.output;
  EXPECT_NE(latest.output.find("step_00000004"), std::string::npos) << latest.output;
  EXPECT_NE(latest.output.find("step:        4\n"), std::string::npos) << latest.output;
  EXPECT_NE(latest.output.find("verify:      OK"), std::string::npos) << latest.output;
  EXPECT_NE(latest.output.find("config:      arch=llama d_model=128 n_layers=2"), std::string::npos)
      << latest.output;
  EXPECT_NE(latest.output.find("model.safetensors"), std::string::npos) << latest.output;

  auto older = run_keel("inspect " + (checkpoints / "step_00000002").string());
  ASSERT_EQ(older.exit_code, 0) << older.output;
  EXPECT_NE(older.output.find("step:        2\n"), std::string::npos) << older.output;

  // One flipped byte in the middle of the weights: inspect fails verification, naming the file.
  const fs::path weights = checkpoints / "step_00000004" / "model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(weights) / 2);
    f.seekg(middle);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(middle);
    f.write(&c, 1);
  }
  auto bad = run_keel("inspect " + (checkpoints / "step_00000004").string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("verify:      FAILED"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("model.safetensors"), std::string::npos) << bad.output;

  // The checkpoints directory then resolves to the newest one that still verifies.
  auto fallback = run_keel("inspect " + checkpoints.string());
  EXPECT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("step:        2\n"), std::string::npos) << fallback.output;
}

TEST(InspectIntegration, MissingDirectoryIsAUserError) {
  auto r = run_keel("inspect /nonexistent/checkpoints");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/checkpoints"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
