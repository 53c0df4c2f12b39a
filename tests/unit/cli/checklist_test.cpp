// Tests of cli/checklist: the "lr decay by step" item says what each schedule kind does after its
// warmup (a constant schedule does not decay).
#include "cli/checklist.h"

#include <gtest/gtest.h>

#include <string>

namespace keel::cli {
namespace {

// The `what` of checklist item `item` for `cfg` (synthetic data: nothing is read from disk).
std::string checklist_what(const config::Config& cfg, const std::string& item) {
  for (const ChecklistItem& i : walk_checklist(cfg, /*parameters=*/1'000'000))
    if (i.item == item) return i.what;
  ADD_FAILURE() << "no checklist item " << item;
  return "";
}

TEST(ChecklistTest, LrDecaySaysWhatEachScheduleKindDoes) {
  config::Config cfg;  // run.max_steps 1000, schedule.min_lr_ratio 0.1, auto warmup
  const std::string tail =
      ": a function of the optimizer step, never of wall time; the recovery overlay scales it";

  cfg.schedule.kind = config::ScheduleKind::kCosine;
  EXPECT_EQ(checklist_what(cfg, "lr decay by step"), "cosine to 0.1 x peak at step 1000" + tail);

  // phases {0.2, 0.6, 0.2}: the decay phase is the last 200 of 1000 steps.
  cfg.schedule.kind = config::ScheduleKind::kThreePhase;
  EXPECT_EQ(checklist_what(cfg, "lr decay by step"),
            "three_phase: the peak until step 800, then exponential decay to 0.1 x peak at step "
            "1000" +
                tail);

  // The lr stays at its peak: no "to 0.1 x peak".
  cfg.schedule.kind = config::ScheduleKind::kConstant;
  const std::string constant = checklist_what(cfg, "lr decay by step");
  EXPECT_EQ(constant,
            "constant: the peak lr from the warmup's end to the last step, no decay "
            "(schedule.min_lr_ratio is not used)" +
                tail);
  EXPECT_EQ(constant.find("x peak"), std::string::npos) << constant;
}

}  // namespace
}  // namespace keel::cli
