// The shipped 124M configs: the experimental one and the locked production one made from it
// (README, "From an experiment to a production config"). Both name `device: cuda`, so these run
// `keel validate --no-probe`: the probes would time a matmul on the configured device.
#include <gtest/gtest.h>

#include "harness.h"

namespace keel::testing {
namespace {

const std::string kExperimental = source_path("configs/gpt2-124m.yaml");
const std::string kProduction = source_path("configs/production-124m.yaml");

TEST(ProductionConfig, ShippedGpt2AndProductionConfigsValidate) {
  for (const auto& config : {kExperimental, kProduction}) {
    auto r = run_keel("validate " + config + " --no-probe");
    EXPECT_EQ(r.exit_code, 0) << config << "\n" << r.output;
    EXPECT_NE(r.output.find(config + ": valid"), std::string::npos) << r.output;
  }
}

// The production lock: a locked key cannot be overridden, neither by validate nor by train (which
// refuses before it allocates anything), and the message names the key and the pattern.
TEST(ProductionConfig, LockedKeyOverrideIsRefusedNamingTheKey) {
  auto v = run_keel("validate " + kProduction + " --no-probe --set optim.lr=1e-3");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("--set[1]: error: optim.lr: is locked by production.locked_keys "
                          "pattern 'optim.*'"),
            std::string::npos)
      << v.output;

  ScratchDir dir("production_lock");
  auto t = run_keel("train " + kProduction + " --run-dir " + dir.str() + " --set optim.lr=1e-3");
  EXPECT_EQ(t.exit_code, 2) << t.output;
  EXPECT_NE(t.output.find("optim.lr: is locked"), std::string::npos) << t.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "metrics.jsonl")) << t.output;

  // The same override is fine in the experimental config it was made from.
  auto e = run_keel("validate " + kExperimental + " --no-probe --set optim.lr=1e-3");
  EXPECT_EQ(e.exit_code, 0) << e.output;
}

TEST(ProductionConfig, FaultsAndUnlockingAreRefused) {
  auto f = run_keel("validate " + kProduction +
                    " --no-probe --set 'faults=[{kind: nan_grad, at_step: 5}]'");
  EXPECT_EQ(f.exit_code, 2) << f.output;
  EXPECT_NE(f.output.find("faults are refused in a production config"), std::string::npos)
      << f.output;
  auto u = run_keel("validate " + kProduction + " --no-probe --set production.locked=false");
  EXPECT_EQ(u.exit_code, 2) << u.output;
  EXPECT_NE(u.output.find("production.locked: production settings are always locked"),
            std::string::npos)
      << u.output;
}

// Two ranks double the global batch to 1024 sequences at lr 6e-4: outside both validated
// combinations, which the message lists.
TEST(ProductionConfig, OffCombinationIsReportedWithTheValidatedRanges) {
  auto r = run_keel("validate " + kProduction + " --no-probe --world-size 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("production.validated: lr=6e-4, global_batch=1024 (micro_batch_size 16 "
                          "x grad_accum_steps 32 x world_size 2) lies outside every validated "
                          "combination"),
            std::string::npos)
      << r.output;

  // A rank of a 2-rank job (torchrun's variables) checks the same global batch before it joins
  // the rendezvous: nothing listens on the port, and the refusal comes first.
  ScratchDir dir("production_two_ranks");
  auto t = run_shell(
      "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 " +
      std::string(keel::testing::kKeelBinary) + " train " + kProduction + " --run-dir " +
      dir.str());
  EXPECT_EQ(t.exit_code, 2) << t.output;
  EXPECT_NE(t.output.find("global_batch=1024"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("keel validate --world-size 2"), std::string::npos) << t.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "metrics.jsonl")) << t.output;
}

}  // namespace
}  // namespace keel::testing
