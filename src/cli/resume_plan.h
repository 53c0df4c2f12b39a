// What each --resume mode would do in a run directory, for `keel inspect RUN_DIR` and
// `keel validate` (when the config's run directory exists): the checkpoint latest and stable
// would load, whether a crash loop turns latest into a stable recovery, the abandoned timelines.
#pragma once

#include <filesystem>
#include <string>

namespace keel::cli {

// Lines of text (each ending in '\n'); empty when `checkpoints_dir` holds no checkpoint.
// `run_dir` is where starts.jsonl and the heartbeat are (may be empty: no crash-loop check).
std::string describe_resume(const std::filesystem::path& checkpoints_dir,
                            const std::filesystem::path& run_dir);

}  // namespace keel::cli
