// spdlog lives here alone: this file is compiled against Debian's fmt, without LibTorch's headers.
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <mutex>

namespace keel::log {
namespace {

std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> instance;
  return instance;
}
bool g_quiet_rank = false;
std::once_flag g_default_once;

void ensure_logger() {
  std::call_once(g_default_once, [] {
    if (!logger()) init(0, 1, false);
  });
}

}  // namespace

void init(int rank, int world_size, bool verbose) {
  // Logs go to stderr so that stdout stays free for machine-readable output (inspect, validate).
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto l = std::make_shared<spdlog::logger>("keel", sink);
  // Under `keel launch` every line already arrives with the launcher's "[rank R] " prefix.
  const char* prefixed = std::getenv("KEEL_LAUNCH_PREFIXES_RANKS");
  const bool tagged_by_launcher = prefixed && std::string(prefixed) == "1";
  std::string rank_tag =
      world_size > 1 && !tagged_by_launcher ? "[rank " + std::to_string(rank) + "] " : "";
  l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ " + rank_tag + "%v");
  l->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  l->flush_on(spdlog::level::info);
  g_quiet_rank = rank != 0;
  logger() = l;
}

void write(Level level, std::string_view component, std::string_view message) {
  ensure_logger();
  if (g_quiet_rank && (level == Level::kInfo || level == Level::kDebug)) return;
  std::string line = "[" + std::string(component) + "] " + std::string(message);
  switch (level) {
    case Level::kDebug:
      logger()->debug(line);
      break;
    case Level::kInfo:
      logger()->info(line);
      break;
    case Level::kWarn:
      logger()->warn(line);
      break;
    case Level::kError:
      logger()->error(line);
      break;
  }
}

}  // namespace keel::log
