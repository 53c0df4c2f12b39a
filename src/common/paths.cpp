#include "common/paths.h"

#include <fcntl.h>  // AT_FDCWD
#include <ftw.h>
#include <signal.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>

namespace keel {
namespace {

int remove_entry(const char* p, const struct stat*, int, struct FTW*) {
  return ::remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

// The pid of NAME.tmp-<pid>, if the name has that shape.
std::optional<pid_t> tmp_owner(const std::string& name) {
  auto pos = name.rfind(".tmp-");
  if (pos == std::string::npos || pos + 5 >= name.size()) return std::nullopt;
  long pid = 0;
  for (size_t i = pos + 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || pid > 1'000'000'000) return std::nullopt;
    pid = pid * 10 + (name[i] - '0');
  }
  return static_cast<pid_t>(pid);
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

bool is_stale_tmp(const std::string& name) {
  const auto pid = tmp_owner(name);
  return pid && (*pid == ::getpid() || !process_alive(*pid));
}

int rename_or_exchange(const std::filesystem::path& from, const std::filesystem::path& to,
                       bool* exchanged) {
  *exchanged = false;
  if (::rename(from.c_str(), to.c_str()) == 0) return 0;
  if (errno != EEXIST && errno != ENOTEMPTY) return errno;
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) return errno;
  *exchanged = true;
  return 0;
}

void remove_tree(const std::filesystem::path& path, std::error_code& ec) {
  ec.clear();
  if (::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
    ec = std::error_code(errno, std::generic_category());
}

}  // namespace keel
