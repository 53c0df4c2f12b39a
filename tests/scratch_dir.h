// The tests' one scratch directory: unit and integration tests alike create temporary files here.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "checkpoint/file_io.h"

namespace keel::testing {

// A fresh, empty directory under the system temp dir, temp_directory_path()/keel_test_<name>_<pid>,
// removed (with everything in it) by the destructor. A leftover of a crashed earlier run that had
// the same pid is emptied first. The pid keeps parallel test processes apart; `name` need only be
// unique among the scratch directories alive at once in one process.
// Removal is checkpoint::remove_tree, not std::filesystem::remove_all: that one resolves to
// libtorch.so's incompatible copy and crashes (see checkpoint/file_io.h).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("keel_test_" + name + "_" + std::to_string(::getpid()))) {
    remove();
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { remove(); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // path()/name as a std::string, the form most keel APIs take; it converts to a path implicitly,
  // so std::filesystem calls take it too. For a std::filesystem::path: path() / name.
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  void remove() const {
    std::error_code ec;
    checkpoint::remove_tree(path_, ec);
  }

  std::filesystem::path path_;
};

}  // namespace keel::testing
