// checkpoint.every_steps auto and the stable cadence as functions of measured figures
// (checkpointer.h declares them).
#include <algorithm>

#include "checkpoint/checkpointer.h"

namespace keel::checkpoint {

double checkpoint_overhead(double stall_seconds, double step_seconds, int64_t interval) {
  if (interval <= 0 || !(step_seconds > 0)) return 0.0;
  return stall_seconds / (static_cast<double>(interval) * step_seconds);
}

int64_t auto_interval(double stall_seconds, double step_seconds, double max_overhead,
                      int64_t max_steps) {
  const int64_t most = std::max<int64_t>(kMinAutoInterval, max_steps / kMinAutoCheckpoints);
  const double raw = stall_seconds / (max_overhead * step_seconds);
  if (!(raw >= 0) || !(raw < 1e15)) return most;  // no usable measurement: the densest allowed
  double decade = 1;
  while (decade * 10 < raw) decade *= 10;  // raw lies in (decade, 10 x decade] (or below 1)
  double rounded = 10 * decade;
  for (double r : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0}) {
    if (r * decade >= raw) {
      rounded = r * decade;
      break;
    }
  }
  return std::clamp<int64_t>(std::llround(rounded), kMinAutoInterval, most);
}

int64_t stable_interval(const config::CheckpointConfig& cfg, int64_t checkpoint_interval) {
  return cfg.stable.every_steps > 0 ? cfg.stable.every_steps : checkpoint_interval;
}

int64_t stable_window(const config::CheckpointConfig& cfg, int64_t checkpoint_interval) {
  return cfg.stable.window == config::kAuto ? std::max<int64_t>(checkpoint_interval, 1)
                                            : cfg.stable.window;
}

}  // namespace keel::checkpoint
