#include "monitor/json_record.h"

#include <charconv>
#include <cmath>

namespace keel::monitor {

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
  body_ += nlohmann::json(std::string(k)).dump();
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
  body_ += nlohmann::json(std::string(value)).dump();
  return *this;
}
JsonRecord& JsonRecord::add(std::string_view k, const nlohmann::json& value) {
  key(k);
  body_ += value.dump();
  return *this;
}

}  // namespace keel::monitor
