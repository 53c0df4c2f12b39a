#include "cli/number_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace keel::cli {
namespace {

std::string trimmed(std::string s) {
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), space));
  s.erase(std::find_if_not(s.rbegin(), s.rend(), space).base(), s.end());
  return s;
}

// The whole of `text` as a double (strtod's forms: 80, 80.5, 80e9); false when anything is left.
bool parse_number(const std::string& text, double& value, size_t& used) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  used = static_cast<size_t>(end - text.c_str());
  return used > 0 && errno == 0 && std::isfinite(value);
}

constexpr std::pair<const char*, double> kUnits[] = {{"", 1.0},
                                                     {"b", 1.0},
                                                     {"k", 1e3},
                                                     {"kb", 1e3},
                                                     {"m", 1e6},
                                                     {"mb", 1e6},
                                                     {"g", 1e9},
                                                     {"gb", 1e9},
                                                     {"t", 1e12},
                                                     {"tb", 1e12},
                                                     {"kib", 1024.0},
                                                     {"mib", 1048576.0},
                                                     {"gib", 1073741824.0},
                                                     {"tib", 1099511627776.0}};

}  // namespace

CLI::Validator whole_at_least(long min, const std::string& unit) {
  return CLI::Validator(
      [min, unit](std::string& input) -> std::string {
        const std::string text = trimmed(input);
        char* end = nullptr;
        errno = 0;
        const long value = std::strtol(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0 || value < min)
          return fmt::format("'{}' {}: give a whole number of {}, {} or more", input, unit, unit,
                             min);
        return "";
      },
      fmt::format("{} (at least {})", unit, min), "whole_at_least");
}

CLI::Validator positive(const std::string& unit) {
  return CLI::Validator(
      [unit](std::string& input) -> std::string {
        double value = 0;
        size_t used = 0;
        const std::string text = trimmed(input);
        if (!parse_number(text, value, used) || used != text.size() || !(value > 0))
          return fmt::format("'{}': give a number of {} above 0", input, unit);
        return "";
      },
      unit + " (above 0)", "positive");
}

bool parse_byte_size(const std::string& input, double& bytes, std::string& error) {
  const std::string text = trimmed(input);
  double value = 0;
  size_t used = 0;
  std::string unit;
  if (parse_number(text, value, used)) {
    unit = trimmed(text.substr(used));
    std::transform(unit.begin(), unit.end(), unit.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const auto* found = std::find_if(std::begin(kUnits), std::end(kUnits),
                                     [&](const auto& u) { return unit == u.first; });
    if (found != std::end(kUnits)) {
      bytes = value * found->second;
      if (bytes > 0) return true;
      error = fmt::format("'{}': a size must be above 0 bytes", input);
      return false;
    }
  }
  error = fmt::format(
      "'{}' is not a size: give bytes (80e9) or a number with a unit: KB, MB, GB, TB (powers of "
      "1000; K, M, G, T too) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 80GB or 74.5GiB",
      input);
  return false;
}

CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        double bytes = 0;
        std::string error;
        if (!parse_byte_size(input, bytes, error)) return error;
        input = fmt::format("{:.17g}", bytes);
        return "";
      },
      "bytes (80e9, 80GB, 74.5GiB)", "byte_size");
}

}  // namespace keel::cli
