// Whole runs that must stop on purpose: data-pipeline faults on prepared shards, and preemption.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <set>
#include <thread>

#include "harness.h"

namespace keel::testing {
namespace {

const char* kFortunes = "/usr/share/games/fortunes/fortunes";

class ShardRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kFortunes))
      GTEST_SKIP() << "the fortunes package is not installed";
    auto r = run_keel(std::string("prepare --input ") + kFortunes + " --output " + data() +
                      " --separator % --seq-len 32 --val-fraction 0.05");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string data() const { return (dir_.path() / "data").string(); }
  std::string train(const std::string& data_dir, const std::string& extra) const {
    return "train " + source_path("configs/tiny.yaml") + " --run-dir " +
           (dir_.path() / "run").string() +
           " --set data.source=shards --set data.path=" + data_dir +
           " --set model.vocab_size=264 --set model.seq_len=32 --set model.d_model=64"
           " --set logging.progress=off --set logging.every_steps=1 --set eval.batches=1"
           " --set schedule.warmup_steps=2 " +
           extra;
  }
  ScratchDir dir_{"shard_run"};
};

TEST_F(ShardRunTest, TrainsOnPreparedShards) {
  auto r = run_keel(train(data(), "--set run.max_steps=10"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto metrics = read_jsonl(dir_.path() / "run/metrics.jsonl");
  ASSERT_EQ(metrics.back()["step"].get<int64_t>(), 10);
  EXPECT_LT(metrics.back()["loss"].get<double>(), metrics.front()["loss"].get<double>());
}

TEST_F(ShardRunTest, DroppedSamplesStopTheRunWithBothCounts) {
  auto r = run_keel(train(data(),
                          "--set run.max_steps=20 "
                          "--set 'faults=[{kind: drop_samples, at_step: 2, factor: 0.1}]'"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("data-count mismatch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the trainer consumed"), std::string::npos) << r.output;
}

// With dynamic accumulation the check counts the micro-batches each step took, so it still holds
// the loader to the trainer's count.
TEST_F(ShardRunTest, DroppedSamplesStopADynamicAccumulationRun) {
  auto r = run_keel(train(data(),
                          "--set run.max_steps=20 --set data.grad_accum=dynamic "
                          "--set data.grad_accum_steps=2 "
                          "--set 'faults=[{kind: drop_samples, at_step: 2, factor: 0.1}]'"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("data-count mismatch"), std::string::npos) << r.output;
}

// The producer sleeps 1.5 s before step 4's batch: the trainer waits (an event and the metric say
// how long), then trains on exactly the samples a clean run would, none twice and none skipped.
TEST_F(ShardRunTest, LoaderStallMakesTheRunWaitWithoutReusingSamples) {
  auto clean = run_keel(train(data(), "--set run.max_steps=12 --set logging.sample_ids=true"));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const auto clean_samples = read_jsonl(dir_.path() / "run/samples.jsonl");
  std::error_code ec;
  checkpoint::remove_tree(dir_.path() / "run", ec);

  auto r = run_keel(train(data(),
                          "--set run.max_steps=12 --set logging.sample_ids=true "
                          "--set 'faults=[{kind: loader_stall, at_step: 4, seconds: 1.5}]'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  double waited_ms = 0;
  for (const auto& e : read_jsonl(dir_.path() / "run/events.jsonl"))
    if (e["kind"] == "loader_wait") waited_ms += e["detail"]["wait_ms"].get<double>();
  EXPECT_GT(waited_ms, 1000) << r.output;
  double metric_wait_ms = 0;
  const auto metrics = read_jsonl(dir_.path() / "run/metrics.jsonl");
  for (const auto& m : metrics) metric_wait_ms += m["loader_wait_ms"].get<double>();
  EXPECT_GT(metric_wait_ms, 1000);
  EXPECT_EQ(metrics.back()["samples_seen"].get<int64_t>(), 12 * 16);

  const auto samples = read_jsonl(dir_.path() / "run/samples.jsonl");
  ASSERT_EQ(samples.size(), 12u);
  ASSERT_EQ(clean_samples.size(), 12u);
  std::set<int64_t> seen;
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i]["step"].get<int64_t>(), static_cast<int64_t>(i) + 1);
    EXPECT_EQ(samples[i]["ids"], clean_samples[i]["ids"]) << "step " << i + 1;
    for (int64_t id : samples[i]["ids"].get<std::vector<int64_t>>())
      EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " served twice";
  }
  EXPECT_EQ(seen.size(), 12u * 16u);
}

TEST_F(ShardRunTest, CorruptShardExitsTwoNamingTheFile) {
  auto shard = std::filesystem::path(data()) / "train_00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("XXXX", 4);
  }
  auto r = run_keel(train(data(), "--set run.max_steps=3"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train_00000.bin"), std::string::npos) << r.output;
}

// A scheduler's SIGTERM: the step finishes, a checkpoint is written, exit 143; resume completes.
TEST(PreemptionIntegration, SigtermCheckpointsAndResumes) {
  ScratchDir d("sigterm");
  const std::string args =
      "train " + source_path("configs/tiny.yaml") + " --run-dir " + d.str() +
      " --set run.max_steps=100000 --set logging.progress=off"
      " --set eval.every_steps=0 --set eval.batches=1 --set schedule.warmup_steps=2";
  // Once it trains, preempt it.
  const int pid = start_keel_training(args, d.path(), d.path() / "log");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  // The shell's child is not ours to waitpid: poll until it is gone.
  for (int i = 0; i < 600 && ::kill(pid, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto events = read_jsonl(d.path() / "events.jsonl");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["kind"], "interrupted");
  int64_t stopped_at = events.back()["step"].get<int64_t>();
  EXPECT_GT(stopped_at, 0);
  auto r =
      run_keel(args + " --resume latest --set run.max_steps=" + std::to_string(stopped_at + 3));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"].get<int64_t>(), stopped_at + 3);
}

}  // namespace
}  // namespace keel::testing
