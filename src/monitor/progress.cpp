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

std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e4) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

Progress::Progress(config::Switch mode, bool enabled) : enabled_(enabled) {
  live_ = enabled &&
          (mode == config::Switch::kOn || (mode == config::Switch::kAuto && isatty(STDERR_FILENO)));
}

void Progress::update(const ProgressSample& s) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!first_) first_.emplace(s.step, now);
  const double elapsed = std::chrono::duration<double>(now - first_->second).count();
  const int64_t done = s.step - first_->first;
  // Until a second line there is no pace of this process's own to go by.
  const std::string eta =
      done > 0 ? format_duration(elapsed / done * (s.max_steps - s.step)) : std::string("-");
  std::string floor = s.loss_floor >= 0 ? fmt::format(" (floor {:.3f})", s.loss_floor) : "";
  show("train",
       fmt::format("step {:>6}/{} | loss {:.4f}{} | lr {:.3e} | gnorm {:.3f} | {:.1f} ms | {:.0f} "
                   "tok/s | {} tokens | ETA {}",
                   s.step, s.max_steps, s.loss, floor, s.lr, s.grad_norm, s.step_ms, s.tokens_per_s,
                   format_count(static_cast<double>(s.tokens_seen)), eta));
}

void Progress::show(const std::string& component, const std::string& line, bool log) {
  if (!enabled_) return;
  if (live_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    dirty_ = true;
  } else if (log) {
    log::info(component, "{}", line);
  }
}

void Progress::finish() {
  if (live_ && dirty_) std::fputc('\n', stderr);
  dirty_ = false;
}

}  // namespace keel::monitor
