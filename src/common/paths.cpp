#include "common/paths.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

namespace keel {
namespace {

int remove_entry(const char* p, const struct stat*, int, struct FTW*) {
  return ::remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

}  // namespace

void remove_tree(const std::filesystem::path& path, std::error_code& ec) {
  ec.clear();
  if (::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
    ec = std::error_code(errno, std::generic_category());
}

}  // namespace keel
