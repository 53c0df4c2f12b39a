// Command-line contracts a script relies on: stdout of `keel validate --print-config` is a config
// `keel train` loads, `keel launch` says where `--` goes when it is missing, and `keel validate
// --device-memory` refuses a config that does not fit with the change that makes it fit.
#include <gtest/gtest.h>

#include "harness.h"

namespace keel::testing {
namespace {

TEST(PrintConfig, StdoutIsTheConfigAloneAndTrainLoadsIt) {
  ScratchDir d("print_config");
  // A subshell: run_shell adds its own 2>&1 after the command.
  auto r = run_shell("(" + std::string(keel::testing::kKeelBinary) + " validate " +
                     source_path("configs/tiny.yaml") +
                     " --no-probe --set optim.lr=1e-3 --print-config > " + d / "r.yaml" + " 2> " +
                     d / "report.txt)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(d / "r.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(yaml.find("estimate"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("checklist"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find(": valid\n"), std::string::npos) << yaml;
  std::ifstream report_in(d / "report.txt");
  const std::string report((std::istreambuf_iterator<char>(report_in)), {});
  EXPECT_NE(report.find(": valid"), std::string::npos) << report;  // the verdict on stderr

  r = run_keel("train " + d / "r.yaml" + kQuickRun + " --set run.max_steps=3 --run-dir " +
               d / "run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The run used the overridden lr the printed config carried.
  std::ifstream resolved(d.path() / "run" / "config.resolved.yaml");
  const std::string used((std::istreambuf_iterator<char>(resolved)), {});
  EXPECT_NE(used.find("lr: 0.001"), std::string::npos) << used;
}

TEST(LaunchHint, OptionsOfTheCommandWithoutDashDashAreRefusedWithTheFixedLine) {
  auto r = run_keel("launch --nproc 2 train configs/tiny.yaml --set run.max_steps=5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("keel launch --nproc 2 -- train configs/tiny.yaml --set "
                          "run.max_steps=5"),
            std::string::npos)
      << r.output;
}

// A config whose memory plan does not fit the device is refused before anything is printed on
// stdout, with the cheapest change that fits; that change then fits.
TEST(MemoryPlan, DeviceMemoryRefusesWithTheCheapestChangeThatFits) {
  ScratchDir d("memory_plan");
  const std::string config = source_path("configs/gpt2-124m.yaml");
  auto r = run_shell("(" + std::string(keel::testing::kKeelBinary) + " validate " + config +
                     " --no-probe --device-memory 5e9 --print-config > " + d / "out.yaml" + ")");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::ifstream out(d / "out.yaml");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(out)), {}), "");
  EXPECT_NE(r.output.find("memory plan per rank"), std::string::npos) << r.output;
  const std::string hint = "HINT: the cheapest change that fits: ";
  const auto at = r.output.find(hint);
  ASSERT_NE(at, std::string::npos) << r.output;
  std::string change = r.output.substr(at + hint.size());
  change = change.substr(0, change.find('\n'));
  EXPECT_EQ(change, "model.activation_checkpointing: full");
  r = run_keel("validate " + config +
               " --no-probe --device-memory 5e9 --set model.activation_checkpointing=full");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("activation_checkpointing full"), std::string::npos) << r.output;
  // Fits: no refusal, the plan on the report.
  r = run_keel("validate " + config + " --no-probe --device-memory 80e9");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Nothing fits at this world size: the advice names the fewest ranks that fit, or that no number
  // of ranks does, not "use more ranks" whatever --world-size said.
  r = run_keel("validate " + config + " --no-probe --device-memory 1.5e9 --world-size 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nothing keel can change fits at 2 rank(s); at 4 ranks (--world-size 4)"),
            std::string::npos)
      << r.output;
  r = run_keel("validate " + config + " --no-probe --device-memory 1e8 --world-size 8");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nothing fits at any number of ranks"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
