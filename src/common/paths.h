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

// Leftovers of writes cut short: NAME.tmp-<pid> whose process is gone (or is this one, which has
// nothing in flight when it asks). False for any other name.
bool is_stale_tmp(const std::string& name);

// Renames directory `from` onto `to`, atomically: onto a missing or empty `to` a plain rename; over
// a non-empty one the two are exchanged (renameat2 RENAME_EXCHANGE), `from` then naming the old
// contents, and *exchanged is set. 0, or the errno of the failure.
int rename_or_exchange(const std::filesystem::path& from, const std::filesystem::path& to,
                       bool* exchanged);

// " (relative to /the/working/directory)" for a relative path, "" for an absolute one: a message
// about a missing relative path names where it was looked for.
inline std::string relative_note(const std::filesystem::path& path) {
  if (!path.is_relative()) return "";
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  return ec ? std::string() : " (relative to " + cwd.string() + ")";
}

}  // namespace keel
