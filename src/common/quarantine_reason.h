// Why a sample is in RUN_DIR/quarantine.jsonl: its "reason" field, one list, the file's contract
// (DESIGN.md, "Run directory"). The trainer writes them by name, the report reads them back by the
// same names.
#pragma once

#include <string>

namespace keel {

enum class QuarantineReason {
  kScreen,        // masked by the screen: far above the per-sample baseline
  kLowLoss,       // below the low threshold (stability.screen.low: quarantine)
  kRepeatedData,  // repeats the content of a sample seen under another id (ditto)
  kAlarm,         // in a step whose alarm the data set off: the step dropped
  kIncidentSkip,  // in a step an incident dropped once its rollbacks were spent
  kRollback,      // in the window a rollback skipped (and its skip-ahead)
  kCrashLoop,     // in the window a crash loop's recovery skipped
  kResume,        // in the window a recovering resume skipped: "resume_<how it was named>"
};

// The name quarantine.jsonl carries; kResume's is a prefix, completed by resume_reason().
constexpr const char* name_of(QuarantineReason reason) {
  switch (reason) {
    case QuarantineReason::kScreen:
      return "screen";
    case QuarantineReason::kLowLoss:
      return "low_loss";
    case QuarantineReason::kRepeatedData:
      return "repeated_data";
    case QuarantineReason::kAlarm:
      return "alarm";
    case QuarantineReason::kIncidentSkip:
      return "incident_skip";
    case QuarantineReason::kRollback:
      return "rollback";
    case QuarantineReason::kCrashLoop:
      return "crash_loop";
    case QuarantineReason::kResume:
      return "resume_";
  }
  return "?";
}

// A recovering resume's reason: "resume_latest", "resume_stable" or "resume_<PATH>" as the
// resume was asked for.
inline std::string resume_reason(const std::string& mode) {
  return name_of(QuarantineReason::kResume) + mode;
}

}  // namespace keel
