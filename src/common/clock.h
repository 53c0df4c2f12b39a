// The monotonic clock keel times itself with, and the one way to read an interval from it.
#pragma once

#include <chrono>

namespace keel {

using Clock = std::chrono::steady_clock;

// Seconds elapsed since `start`, as a double.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace keel
