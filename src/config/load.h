// Reading a config: YAML file -> --set overrides -> typed Config, remembering where each key came
// from so that every later message can say FILE:LINE:COL. Loading never throws on the user's
// mistakes; it collects them as diagnostics so `keel validate` can print every problem at once.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/schema.h"

namespace keel::config {

// Where a key's value came from. line/column are 1-based; for a --set override, file is "--set"
// and column is the 1-based index of the flag among the overrides (line 0).
struct SourceLoc {
  std::string file;
  int line = 0;
  int column = 0;
};

struct Diagnostic {
  enum class Severity { kError, kWarning };
  Severity severity = Severity::kError;
  std::string key;  // dotted key path, e.g. "optim.lr" or "faults[1].kind"; may be empty
  SourceLoc loc;
  std::string message;
  // "FILE:LINE:COL: error: key.path: message" (or "warning:").
  std::string format() const;
};

struct LoadedConfig {
  Config config;
  std::string path;                            // the YAML file ("<string>" when loaded from text)
  std::map<std::string, SourceLoc> locations;  // key path -> where it was set (file or --set)
  std::vector<Diagnostic> diagnostics;         // unknown keys, type errors, refused overrides
  // Location of a key for messages: its own location, else the nearest set ancestor, else FILE:1:1.
  SourceLoc where(const std::string& key) const;
  bool has_errors() const;
};

// Loads `path` and applies `overrides` ("a.b=value", value parsed as YAML: 3e-4, [0.9, 0.95],
// true). Throws ConfigError only when the file cannot be read or is not YAML at all (with
// line/column).
LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
LoadedConfig load_config_from_string(const std::string& yaml_text, const std::string& name,
                                     const std::vector<std::string>& overrides = {});

// The resolved config as YAML, every key written (config.resolved.yaml). Loading it back gives an
// equal Config.
std::string to_yaml(const Config& config);

// Every scalar key path of the schema ("run.name", "optim.betas", ...), for did-you-mean and locks.
std::vector<std::string> all_key_paths();

// True when `key` (dotted path) is matched by a lock pattern ("optim.*", "run.precision").
bool key_matches(const std::string& pattern, const std::string& key);

}  // namespace keel::config
