#include "monitor/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "common/log.h"

namespace keel::monitor {

std::string format_duration(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

Progress::Progress(config::Switch mode, bool enabled) : enabled_(enabled) {
  live_ = enabled &&
          (mode == config::Switch::kOn || (mode == config::Switch::kAuto && isatty(STDERR_FILENO)));
}

void Progress::update(const ProgressSample& s) {
  if (!enabled_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = s.step > 0 ? elapsed / s.step * (s.max_steps - s.step) : 0.0;
  std::string floor = s.loss_floor >= 0 ? fmt::format(" (floor {:.3f})", s.loss_floor) : "";
  std::string line = fmt::format(
      "step {:>6}/{} | loss {:.4f}{} | lr {:.3e} | gnorm {:.3f} | {:.1f} ms | {:.0f} tok/s | ETA "
      "{}",
      s.step, s.max_steps, s.loss, floor, s.lr, s.grad_norm, s.step_ms, s.tokens_per_s,
      format_duration(eta));
  if (live_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    dirty_ = true;
  } else {
    log::info("train", "{}", line);
  }
}

void Progress::finish() {
  if (live_ && dirty_) std::fputc('\n', stderr);
  dirty_ = false;
}

}  // namespace keel::monitor
