#include "common/host_name.h"

#include <unistd.h>

namespace keel {

std::string host_name(const std::string& fallback) {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return fallback;
  return name;
}

}  // namespace keel
