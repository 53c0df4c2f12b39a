// Component-tagged logging ("[data] ...", "[guard] ..."), backed by spdlog in log.cpp.
// Only rank 0 prints info by default; warnings and errors print on every rank.
// Formatting uses fmt (LibTorch's copy, header-only); spdlog itself never sees this header's
// callers.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace keel::log {

enum class Level { kDebug, kInfo, kWarn, kError };

// Call once per process. `rank` prefixes multi-rank output; quiet ranks print warnings and up only.
void init(int rank, int world_size, bool verbose = false);
void write(Level level, std::string_view component, std::string_view message);

template <class... Args>
void info(std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kInfo, component, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kWarn, component, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, component, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void debug(std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kDebug, component, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace keel::log
