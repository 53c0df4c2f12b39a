// A trainer changes process-wide settings in setup() (threads, host allocator, CPU GEMM,
// deterministic algorithms, signal handlers); when it ends they are as they were, so a second
// trainer in the same process (tests, tools) starts from a clean slate.
#include <gtest/gtest.h>

#include <csignal>

#include "common/host_allocator.h"
#include "distributed/communicator.h"
#include "model/fused_ops.h"
#include "scratch_dir.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace {

using keel::testing::ScratchDir;

void a_handler(int) {}

TEST(ProcessSettings, TrainerPutsProcessWideSettingsBack) {
  const ScratchDir run_dir("process_settings");
  const int threads = at::get_num_threads();
  const bool caching = caching_host_allocator_installed();
  const model::CpuMatmul matmul = model::cpu_matmul();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  auto* previous_term = std::signal(SIGTERM, a_handler);

  config::Config cfg;
  cfg.run.device = config::Device::kCpu;
  cfg.run.max_steps = 2;
  // Every setting the opposite of what the process has now.
  cfg.run.threads = threads == 1 ? 2 : 1;
  cfg.run.host_allocator =
      caching ? config::HostAllocator::kSystem : config::HostAllocator::kCaching;
  cfg.run.cpu_matmul =
      matmul == model::CpuMatmul::kAten ? model::CpuMatmul::kOneDnn : model::CpuMatmul::kAten;
  cfg.run.deterministic = !deterministic;
  cfg.model.d_model = 32;
  cfg.model.seq_len = 16;
  cfg.eval.every_steps = 0;
  cfg.logging.progress = config::Switch::kOff;
  {
    distributed::SingleProcess comm;
    TrainOptions options;
    options.run_dir = run_dir.str();
    Trainer::State s(cfg, "", options, comm);
    s.setup();
    ASSERT_EQ(at::get_num_threads(), cfg.run.threads);
    ASSERT_NE(caching_host_allocator_installed(), caching);
    ASSERT_NE(model::cpu_matmul(), matmul);
    if (!deterministic) ASSERT_TRUE(at::globalContext().deterministicAlgorithms());
    struct sigaction now {};
    sigaction(SIGTERM, nullptr, &now);
    ASSERT_NE(now.sa_handler, a_handler);  // the trainer's own handler is in
    s.train_step();
  }
  EXPECT_EQ(at::get_num_threads(), threads);
  EXPECT_EQ(caching_host_allocator_installed(), caching);
  EXPECT_EQ(model::cpu_matmul(), matmul);
  EXPECT_EQ(at::globalContext().deterministicAlgorithms(), deterministic);
  EXPECT_EQ(std::signal(SIGTERM, previous_term), a_handler);
}

}  // namespace
}  // namespace keel::train
