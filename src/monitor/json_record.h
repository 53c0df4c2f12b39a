// One JSON object per line, with floats in shortest round-trip form (std::to_chars), so a value
// read back from metrics.jsonl has exactly the bits keel computed. Non-finite floats are written
// as null (JSON has no NaN/Infinity).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace keel::monitor {

class JsonRecord {
 public:
  JsonRecord& add(std::string_view key, double value);
  JsonRecord& add(std::string_view key, int64_t value);
  JsonRecord& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonRecord& add(std::string_view key, bool value);
  JsonRecord& add(std::string_view key, std::string_view value);
  JsonRecord& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonRecord& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  JsonRecord& add(std::string_view key, const nlohmann::json& value);  // nested values
  std::string str() const { return body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_ = "{";
};

std::string format_double(double value);  // shortest round-trip, or "null" when not finite

}  // namespace keel::monitor
