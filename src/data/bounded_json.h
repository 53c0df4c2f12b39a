// JSON from outside (a tokenizer.json from a model hub) parsed with its nesting bounded: a reader
// that walks the value recursively cannot then be driven past its stack by a file nested 100,000
// levels deep.
#pragma once

#include <istream>
#include <string>

#include <nlohmann/json.hpp>

namespace keel::data {

// Parses `in`; DataError naming `path` when it nests deeper than `max_depth` or is not JSON.
nlohmann::json parse_bounded_json(std::istream& in, const std::string& path, int max_depth,
                                  const std::string& hint);

}  // namespace keel::data
