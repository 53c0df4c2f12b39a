// The command line's numbers, checked and converted with messages a person can act on: the unit
// and the valid range, never CLI11's "not in range 0.000000 to 1797693134862315..." (issue 52).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace keel::cli {

// A whole number of at least `min`, counted in `unit` ("steps", "ranks", "threads"):
// "--profile: 0 steps: give a whole number of steps, 1 or more".
CLI::Validator whole_at_least(long min, const std::string& unit);
// A number above 0 in `unit` ("seconds").
CLI::Validator positive(const std::string& unit);
// A size in bytes, as people type it: 80e9, 80GB or 80G (10^9), 74.5GiB (2^30), 512MiB, with or
// without a space; rewritten to the number of bytes. Refuses other units and sizes not above 0.
CLI::Validator byte_size();
// Parses a byte size as byte_size() accepts it; false (and `error` set) otherwise.
bool parse_byte_size(const std::string& text, double& bytes, std::string& error);

}  // namespace keel::cli
