#include "cli/resume_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "common/error.h"
#include "train/run_history.h"

namespace keel::cli {
namespace fs = std::filesystem;

namespace {

std::string step_of(const fs::path& dir) {
  try {
    return std::to_string(checkpoint::read_manifest(dir).step);
  } catch (const CheckpointError&) {
    return "?";
  }
}

}  // namespace

std::string describe_resume(const fs::path& checkpoints_dir, const fs::path& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return {};
  std::optional<fs::path> latest, stable;
  try {
    latest = checkpoint::resolve_checkpoint(checkpoints_dir, checkpoint::Pointer::kLatest);
    stable = checkpoint::resolve_checkpoint(checkpoints_dir, checkpoint::Pointer::kStable);
  } catch (const CheckpointError&) {
  }
  if (!latest && !stable) return {};
  std::string out;
  std::optional<train::Heartbeat> loop;
  if (latest && !run_dir.empty())
    loop = train::crash_loop_after(train::read_abnormal_ends(run_dir.string()),
                                   checkpoint::read_manifest(*latest).step);
  if (latest && !loop)
    out += fmt::format("resume latest: {} (step {}), continuing its timeline\n", latest->string(),
                       step_of(*latest));
  if (loop)
    out += fmt::format(
        "resume latest: the run ended abnormally twice at step {} since that checkpoint, so it "
        "falls back to stable as a recovery (a crash loop)\n",
        loop->step);
  if (stable)
    out += fmt::format(
        "resume stable: {} (step {}), a recovery: lr x stability.recovery.lr_factor for "
        "stability.recovery.steps, newer checkpoints moved to abandoned/, the data since it "
        "skipped (--resume-data skip) or replayed\n",
        stable->string(), step_of(*stable));
  else
    out += "resume stable: no stable snapshot yet (starts fresh)\n";
  std::vector<fs::path> timelines;
  for (const auto& de : fs::directory_iterator(checkpoints_dir / "abandoned", ec))
    if (de.is_directory()) timelines.push_back(de.path());
  std::sort(timelines.begin(), timelines.end());
  for (const auto& t : timelines) {
    std::string steps;
    for (const auto& de : fs::directory_iterator(t, ec))
      if (fs::exists(de.path() / "MANIFEST.json"))
        steps += (steps.empty() ? "" : ", ") + step_of(de.path()) +
                 (checkpoint::verify_checkpoint(de.path()).ok ? " (verifies)" : " (CORRUPT)");
    out += fmt::format("abandoned timeline: {}: step {}\n", t.string(), steps);
  }
  return out;
}

}  // namespace keel::cli
