// The step record: one metrics line per logging window, the window's figures averaged over the
// steps it saw, and the seed's data statistics.
#include "train/step_record.h"

#include <gtest/gtest.h>

#include <fstream>

#include "scratch_dir.h"

namespace keel::train {
namespace {

using keel::testing::ScratchDir;

std::vector<nlohmann::json> read_lines(const std::filesystem::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(DataStatistics, LossQuantilesLeaveNonFiniteLossesOut) {
  std::vector<double> losses;
  for (int i = 1; i <= 100; ++i) losses.push_back(i);
  losses.push_back(std::numeric_limits<double>::infinity());
  const auto s = data_statistics(losses, {}, {});
  EXPECT_DOUBLE_EQ(s["sample_loss"]["mean"].get<double>(), 50.5);
  EXPECT_DOUBLE_EQ(s["sample_loss"]["p50"].get<double>(), 51);  // nearest rank
  EXPECT_DOUBLE_EQ(s["sample_loss"]["p99"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(s["sample_loss"]["max"].get<double>(), 100);
  EXPECT_EQ(s["sample_loss"]["n"].get<int64_t>(), 100);
  EXPECT_FALSE(s.contains("doc_len"));
  EXPECT_FALSE(s.contains("bucket_mix"));
}

TEST(DataStatistics, DocumentLengthsAndBucketMix) {
  const auto s = data_statistics({}, {10, 20, 30, 40}, {2, 0, 2, 2});
  EXPECT_FALSE(s.contains("sample_loss"));
  EXPECT_DOUBLE_EQ(s["doc_len"]["mean"].get<double>(), 25);
  EXPECT_DOUBLE_EQ(s["doc_len"]["p95"].get<double>(), 40);
  EXPECT_DOUBLE_EQ(s["doc_len"]["p50"].get<double>(), 30);  // nearest rank
  EXPECT_DOUBLE_EQ(s["doc_len"]["max"].get<double>(), 40);
  EXPECT_EQ(s["bucket_mix"], (nlohmann::json{{"0", 1}, {"2", 3}}));
}

TEST(StepRecord, WritesOneLinePerWindowAndOpensANewOne) {
  ScratchDir dir("step_record");
  auto files = monitor::RunFiles::open(dir.path().string(), /*writer=*/true);
  monitor::Progress progress(config::Switch::kOff, /*enabled=*/false);
  StepRecord record(files, progress, /*max_steps=*/100, std::nullopt);
  EXPECT_TRUE(std::isnan(record.last_loss()));

  // Six step attempts: four applied (one clipped), two skipped, three samples masked.
  for (int i = 0; i < 6; ++i) {
    StepTally t;
    t.applied = i < 4;
    t.tokens = t.applied ? 256 : 0;
    t.clipped = i == 0;
    t.skipped = !t.applied;
    t.masked = i < 3;
    t.loader_wait_s = i == 0 ? 0.008 : 0.0;
    record.add(t);
  }
  EXPECT_EQ(record.window().steps, 4);
  EXPECT_EQ(record.window().skipped, 2);
  EXPECT_EQ(record.window().masked, 3);
  StepFigures f;
  f.step = 10;
  f.loss = 2.5;
  f.lr = 1e-3;
  f.grad_norm = 2.0;
  f.clip_bound = 1.0;
  f.samples_seen = 40;
  f.tokens_seen = 40 * 64;
  f.guarded = true;
  f.layer_update_ratios = {{"layers.0", 0.01}};
  f.data_statistics = data_statistics({1.0, 3.0}, {}, {});
  f.in_recovery = true;
  record.write(f);
  EXPECT_EQ(record.last_loss(), 2.5);
  EXPECT_EQ(record.window().steps, 0);  // a new window

  f.step = 20;
  f.guarded = false;
  record.write(f);
  files = monitor::RunFiles();  // flushed and closed

  const auto lines = read_lines(dir.path() / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  const auto& a = lines[0];
  EXPECT_EQ(a["step"], 10);
  EXPECT_EQ(a["clipped"], true);
  EXPECT_DOUBLE_EQ(a["clip_rate"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(a["loader_wait_ms"].get<double>(), 2.0);  // 8 ms over 4 steps
  EXPECT_EQ(a["skipped_steps"], 2);
  EXPECT_EQ(a["masked_samples"], 3);
  EXPECT_EQ(a["update_ratio_layers"]["layers.0"], 0.01);
  EXPECT_DOUBLE_EQ(a["sample_loss"]["mean"].get<double>(), 2.0);
  EXPECT_EQ(a["recovery"], true);
  EXPECT_EQ(a["tokens_seen"], 2560);
  // Without the guard, the guard's figures are left out; the window's counts start from zero.
  const auto& b = lines[1];
  EXPECT_FALSE(b.contains("clip_rate"));
  EXPECT_FALSE(b.contains("skipped_steps"));
  EXPECT_FALSE(b.contains("recovery"));
  EXPECT_DOUBLE_EQ(b["loader_wait_ms"].get<double>(), 0.0);
}

}  // namespace
}  // namespace keel::train
