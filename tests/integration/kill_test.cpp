// kill -9 at random moments while the trainer checkpoints every step, 20 cycles: every restart
// resumes from a checkpoint that verifies and loses at most one checkpoint interval.
#include <gtest/gtest.h>

#include <csignal>
#include <random>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "harness.h"

namespace keel::testing {
namespace {

TEST(KillIntegration, TwentyKillsNeverLoseACheckpoint) {
  ScratchDir d("kill9");
  const std::string args =
      "train " + source_path("configs/tiny.yaml") + " --run-dir " + d.str() +
      " --resume latest --set run.max_steps=100000 --set logging.progress=off"
      " --set logging.every_steps=1 --set eval.every_steps=0 --set eval.batches=1"
      " --set schedule.warmup_steps=2 --set checkpoint.every_steps=1"
      " --set checkpoint.keep_last=2 --set stability.enabled=false"
      " --set model.d_model=64 --set model.seq_len=32";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> delay_ms(300, 1500);
  int64_t previous_step = 0;
  for (int cycle = 0; cycle < 20; ++cycle) {
    std::string cmd = std::string(keel::testing::kKeelBinary) + " " + args + " >> " + d.str() +
                      "/log 2>&1 & echo $!";
    std::FILE* p = popen(cmd.c_str(), "r");
    int pid = 0;
    ASSERT_EQ(std::fscanf(p, "%d", &pid), 1);
    pclose(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(pid, SIGKILL);
    for (int i = 0; i < 100 && ::kill(pid, 0) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));

    auto latest =
        checkpoint::resolve_checkpoint(d.path() / "checkpoints", checkpoint::Pointer::kLatest);
    if (!latest) continue;  // killed before the first save
    auto verdict = checkpoint::verify_checkpoint(*latest);
    ASSERT_TRUE(verdict.ok) << "cycle " << cycle << ": " << verdict.problem;
    int64_t ckpt_step = checkpoint::read_manifest(*latest).step;
    EXPECT_GE(ckpt_step, previous_step) << "cycle " << cycle << " went backwards";
    // At most one interval (one step) of the progress the run logged is lost.
    auto metrics = read_jsonl(d.path() / "metrics.jsonl");
    if (!metrics.empty())
      EXPECT_GE(ckpt_step + 1, metrics.back()["step"].get<int64_t>()) << "cycle " << cycle;
    previous_step = ckpt_step;
  }
  EXPECT_GT(previous_step, 0);
  // And the run still finishes from where it was.
  auto r = run_keel(args + " --set run.max_steps=" + std::to_string(previous_step + 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace keel::testing
