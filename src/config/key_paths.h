// Internal to src/config: dotted key paths of the schema ("optim.lr", "data.loader"), for
// did-you-mean suggestions, locks and overrides. load.h has the public all_key_paths().
#pragma once

#include <string>
#include <vector>

namespace keel::config {

std::string join_key(const std::string& prefix, const std::string& key);  // "a" + "b" -> "a.b"
std::string parent_of(const std::string& path);                           // "a.b.c" -> "a.b"
std::string last_segment(const std::string& path);                        // "a.b.c" -> "c"
// Every path of the schema, sections included ("data", "data.loader", "data.loader.workers").
const std::vector<std::string>& schema_paths_with_sections();

}  // namespace keel::config
