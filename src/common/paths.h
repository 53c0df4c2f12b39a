// Path wording for messages about a file or directory that is not there.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace keel {

// rm -rf: removes `path` (file or directory tree) without following symlinks; absent is success.
// Use this, not std::filesystem::remove_all: libtorch.so exports its own, incompatible copy of
// libstdc++'s filesystem library, and calls to that remove_all crash.
void remove_tree(const std::filesystem::path& path, std::error_code& ec);

// " (relative to /the/working/directory)" for a relative path, "" for an absolute one: a message
// about a missing relative path names where it was looked for.
inline std::string relative_note(const std::filesystem::path& path) {
  if (!path.is_relative()) return "";
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  return ec ? std::string() : " (relative to " + cwd.string() + ")";
}

}  // namespace keel
