// The memory options change what is kept, not what is learnt: a run with activation
// checkpointing (full or selective) and the chunked loss trains to the losses of a run without,
// and a resume may switch them.
#include <gtest/gtest.h>

#include "harness.h"

namespace keel::testing {
namespace {

std::vector<double> losses(const std::filesystem::path& run_dir) {
  std::vector<double> out;
  for (const auto& line : read_jsonl(run_dir / "metrics.jsonl"))
    out.push_back(line["loss"].get<double>());
  return out;
}

TEST(MemoryOptions, RecomputeAndChunkedLossTrainToTheSameLosses) {
  ScratchDir d("memory_options");
  const std::string base = kQuickRun + " --set run.max_steps=12 --set model.dropout=0.1";
  auto r = run_keel("train" + base + " --run-dir " + d / "plain");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto plain = losses(d.path() / "plain");
  ASSERT_EQ(plain.size(), 12u);

  // Full recompute replays the same dropout masks: the very same losses.
  r = run_keel("train" + base + " --set model.activation_checkpointing=full --run-dir " +
               d / "full");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(d.path() / "full"), plain);

  const std::vector<std::string> variants = {
      " --set model.activation_checkpointing=selective",
      " --set model.chunked_loss=on --set model.activation_checkpointing=full"};
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string& options = variants[v];
    const std::string dir = "variant" + std::to_string(v);
    r = run_keel("train" + base + options + " --run-dir " + d / dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto other = losses(d.path() / dir);
    ASSERT_EQ(other.size(), plain.size()) << options;
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_NEAR(other[i], plain[i], 1e-5 * plain[i]) << options << " step " << i + 1;
  }
}

TEST(MemoryOptions, AResumeMaySwitchThem) {
  ScratchDir d("memory_options_resume");
  const std::string base = kQuickRun + " --set checkpoint.every_steps=5 --run-dir " + d / "run";
  auto r = run_keel("train" + base + " --set run.max_steps=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("train" + base +
               " --set run.max_steps=8 --resume latest --set model.activation_checkpointing=full"
               " --set model.chunked_loss=on");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_jsonl(d.path() / "run" / "metrics.jsonl").back()["step"], 8);
}

}  // namespace
}  // namespace keel::testing
