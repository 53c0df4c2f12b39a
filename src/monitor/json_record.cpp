#include "monitor/json_record.h"

#include <charconv>
#include <cmath>

namespace keel::monitor {
namespace {

// Text from the data (a decoded sample, a file name) need not be UTF-8: it is written with U+FFFD
// in place of the bytes that are not, rather than failing the record.
std::string dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string format_double(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  std::string s(buf, end);
  // Keep it a JSON number that reads back as a float ("1" would read as an integer).
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

void JsonRecord::key(std::string_view k) {
  if (body_.size() > 1) body_ += ',';
  body_ += dump(nlohmann::json(std::string(k)));
  body_ += ':';
}

JsonRecord& JsonRecord::add(std::string_view k, double value) {
  key(k);
  body_ += format_double(value);
  return *this;
}
JsonRecord& JsonRecord::add(std::string_view k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}
JsonRecord& JsonRecord::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}
JsonRecord& JsonRecord::add(std::string_view k, std::string_view value) {
  key(k);
  body_ += dump(nlohmann::json(std::string(value)));
  return *this;
}
JsonRecord& JsonRecord::add(std::string_view k, const nlohmann::json& value) {
  key(k);
  body_ += dump(value);
  return *this;
}

}  // namespace keel::monitor
