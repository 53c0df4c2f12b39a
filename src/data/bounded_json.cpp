#include "data/bounded_json.h"

#include "common/error.h"

namespace keel::data {

nlohmann::json parse_bounded_json(std::istream& in, const std::string& path, int max_depth,
                                  const std::string& hint) {
  using json = nlohmann::json;
  const json::parser_callback_t bounded = [&](int depth, json::parse_event_t, json&) {
    if (depth > max_depth)
      throw DataError(path + ": nested more than " + std::to_string(max_depth) +
                      " levels deep (a damaged or hostile file?)\nHINT: " + hint);
    return true;
  };
  try {
    return json::parse(in, bounded);
  } catch (const json::exception& e) {
    throw DataError(path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace keel::data
