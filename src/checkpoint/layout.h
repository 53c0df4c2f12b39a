// Internal to src/checkpoint: the on-disk names a checkpoint's files have, and the helpers the
// reading and the writing side share (checkpointer.h describes the layout).
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <string>

namespace keel::checkpoint::internal {

inline constexpr const char* kManifest = "MANIFEST.json";
inline constexpr const char* kFormat = "keel-checkpoint";
inline constexpr int kFormatVersion = 1;

// "optimizer.rank3.safetensors"
inline std::string rank_file(const char* stem, int rank, const char* ext) {
  return fmt::format("{}.rank{}.{}", stem, rank, ext);
}

// "2026-12-05T03:04:05Z"
std::string utc_now_iso(std::chrono::system_clock::time_point now);

// rm -rf that logs instead of throwing: for clean-up on a path that is already failing.
void remove_quietly(const std::filesystem::path& p);

}  // namespace keel::checkpoint::internal
