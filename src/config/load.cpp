// YAML file -> --set overrides -> typed Config. Three visitors walk the field list of schema.h:
//   Reader     fills the structs from YAML nodes, recording where each key came from and collecting
//              every mistake (unknown key, wrong type) as a Diagnostic instead of throwing;
//   Writer     emits the resolved config as YAML (to_yaml), every key, in a form that reads back
//   equal; KeyLister  lists the dotted key paths (did-you-mean, lock patterns).
// An override `--set a.b=v` is turned into the YAML tree {a: {b: v}} and read by the same Reader,
// so its unknown keys and type errors get exactly the messages a file would.
#include "config/load.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include "common/error.h"
#include "common/paths.h"
#include "common/spelling.h"
#include "config/fields.h"
#include "config/key_paths.h"

namespace keel::config {
namespace {

// Diagnostics of a --set flag carry this file name and the flag's 1-based index as the column.
constexpr const char* kSetFile = "--set";

// ---- Did-you-mean
// --------------------------------------------------------------------------------

// " (did you mean X?)" for an unknown `key` under `prefix`, or "". The closest sibling is the usual
// typo; the same name in another section ("lr" under schedule -> optim.lr) is the usual
// misplacement.
std::string did_you_mean(const std::string& prefix, const std::string& key,
                         const std::vector<std::string>& siblings) {
  std::vector<std::string> picks;
  if (auto best = closest_word(key, siblings)) picks.push_back(join_key(prefix, *best));
  for (const auto& path : schema_paths_with_sections()) {
    if (parent_of(path) == prefix || last_segment(path) != key) continue;
    if (picks.size() < 3) picks.push_back(path);
  }
  if (picks.empty()) {  // no sibling and no exact name elsewhere: a near name elsewhere
    for (const auto& path : schema_paths_with_sections()) {
      if (parent_of(path) != prefix && levenshtein(key, last_segment(path)) <= 1) {
        picks.push_back(path);
        break;
      }
    }
  }
  if (picks.empty()) return "";
  std::string out = " (did you mean ";
  for (size_t i = 0; i < picks.size(); ++i) out += (i ? " or " : "") + picks[i];
  return out + "?)";
}

// ---- Scalar conversion
// ---------------------------------------------------------------------------

// How a node looks to the user, for "must be X (got Y)".
std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      return n.Tag() == "?" ? "'" + n.Scalar() + "'" : "the quoted string \"" + n.Scalar() + "\"";
    default:
      return "an undefined value";
  }
}

// Numbers must be plain (unquoted) scalars: `lr: "3e-4"` is a string in YAML and almost always a
// mistake worth naming rather than silently converting.
bool is_plain_scalar(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "?"; }

std::optional<double> parse_double(std::string_view s) {
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" || s == "+.Inf" || s == "+.INF")
    return std::numeric_limits<double>::infinity();
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -std::numeric_limits<double>::infinity();
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  if (s.starts_with('+')) s.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

// Each convert() returns "" on success, else what was expected and what was found.
std::string convert(const YAML::Node& n, std::string& out) {
  if (n.IsNull()) {
    out.clear();
    return "";
  }
  if (!n.IsScalar()) return "must be a string (got " + describe(n) + ")";
  out = n.Scalar();
  return "";
}

std::string convert(const YAML::Node& n, bool& out) {
  if (is_plain_scalar(n)) {
    std::string s = n.Scalar();
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    const bool is_true = s == "true" || s == "yes" || s == "on";
    if (is_true || s == "false" || s == "no" || s == "off") {
      out = is_true;
      return "";
    }
  }
  return "must be true or false (got " + describe(n) + ")";
}

std::string convert(const YAML::Node& n, int64_t& out) {
  const std::string expected = "must be an integer (got " + describe(n) + ")";
  if (!is_plain_scalar(n)) return expected;
  std::string_view s = n.Scalar();
  if (s.starts_with('+')) s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return "";
  // `max_steps: 1e5` is an integer written as a float: accept it when exact, refuse 100.5.
  const auto value = parse_double(n.Scalar());
  constexpr double kLimit = 9.2e18;  // inside int64_t's range
  if (value && std::isfinite(*value) && std::trunc(*value) == *value &&
      std::fabs(*value) < kLimit) {
    out = static_cast<int64_t>(*value);
    return "";
  }
  return expected;
}

std::string convert(const YAML::Node& n, double& out) {
  const auto value = is_plain_scalar(n) ? parse_double(n.Scalar()) : std::nullopt;
  if (!value) return "must be a number (got " + describe(n) + ")";
  out = *value;
  return "";
}

template <Choice E>
std::string convert(const YAML::Node& n, E& out) {
  const auto value = n.IsScalar() ? parse_choice<E>(n.Scalar()) : std::nullopt;
  if (!value) return "must be one of " + choice_list<E>() + " (got " + describe(n) + ")";
  out = *value;
  return "";
}

// A Switch also reads a bool, as model.qk_norm was one: true (yes) is on, false (no) off.
std::string convert(const YAML::Node& n, Switch& out) {
  bool flag = false;
  if (n.IsScalar() && !parse_choice<Switch>(n.Scalar()) && convert(n, flag).empty()) {
    out = flag ? Switch::kOn : Switch::kOff;
    return "";
  }
  return convert<Switch>(n, out);
}

// An integer that may be `auto` (kAuto).
std::string convert_auto(const YAML::Node& n, int64_t& out) {
  if (is_plain_scalar(n) && n.Scalar() == "auto") {
    out = kAuto;
    return "";
  }
  const std::string problem = convert(n, out);
  if (problem.empty() && out == kAuto) return "must be auto or an integer >= 0 (got -1)";
  return problem.empty() ? "" : "must be auto or an integer (got " + describe(n) + ")";
}

template <class T>
const char* list_example();
template <>
const char* list_example<double>() {
  return "a list of numbers, e.g. [0.9, 0.95]";
}
template <>
const char* list_example<std::string>() {
  return "a list of strings, e.g. [bias, norm]";
}

// ---- Reader
// --------------------------------------------------------------------------------------

// Where diagnostics and locations go, and how node marks become SourceLocs.
struct Sink {
  std::string file;
  std::optional<SourceLoc> fixed;  // set for a --set value: every location is the flag itself
  std::map<std::string, SourceLoc>& locations;
  std::vector<Diagnostic>& diagnostics;

  SourceLoc at(const YAML::Node& n) const {
    if (fixed) return *fixed;
    const YAML::Mark mark = n.Mark();
    if (mark.is_null()) return {file, 1, 1};
    return {file, mark.line + 1, mark.column + 1};  // yaml-cpp counts from 0
  }
  void error(const std::string& key, const SourceLoc& loc, const std::string& message) {
    diagnostics.push_back({Diagnostic::Severity::kError, key, loc, message});
  }
};

// Reads one YAML map into one struct (through visit), then reports the map's keys that no field
// claimed. Keys are matched by name; a key given twice is an error, not "last one wins".
class Reader {
 public:
  Reader(Sink& sink, const YAML::Node& map, std::string prefix)
      : sink_(sink), prefix_(std::move(prefix)) {
    for (auto it = map.begin(); it != map.end(); ++it)
      entries_.push_back({it->first, it->second, false});
  }

  template <class T>
  void field(const char* key, T& value) {
    const Entry* entry = take(key);
    if (!entry) return;
    const std::string path = join_key(prefix_, key);
    const SourceLoc loc = value_loc(*entry);
    sink_.locations[path] = loc;
    T parsed{};
    if (read_value(path, entry->value, loc, parsed)) value = std::move(parsed);
  }
  void field(const char* key, int64_t& value, AutoAllowed) {
    const Entry* entry = take(key);
    if (!entry) return;
    const std::string path = join_key(prefix_, key);
    const SourceLoc loc = value_loc(*entry);
    sink_.locations[path] = loc;
    int64_t parsed = 0;
    if (const std::string problem = convert_auto(entry->value, parsed); !problem.empty()) {
      sink_.error(path, loc, problem);
      return;
    }
    value = parsed;
  }

  template <class S>
  void section(const char* key, S& sub) {
    const Entry* entry = take(key);
    if (!entry) return;
    const std::string path = join_key(prefix_, key);
    // A --set of one key inside a section leaves the section where the file put it.
    if (!sink_.fixed || !sink_.locations.count(path)) sink_.locations[path] = sink_.at(entry->key);
    if (entry->value.IsNull()) return;  // `eval:` with everything commented out: keep the defaults
    if (!entry->value.IsMap()) {
      sink_.error(path, value_loc(*entry),
                  "must be a section (a map of keys) (got " + describe(entry->value) + ")");
      return;
    }
    read_struct(path, entry->value, sub);
  }

  // A list of structs is replaced as a whole (by the file, or by a --set flag).
  template <class S>
  void list(const char* key, std::vector<S>& items) {
    const Entry* entry = take(key);
    if (!entry) return;
    const std::string path = join_key(prefix_, key);
    forget_locations_below(path);
    sink_.locations[path] = sink_.at(entry->key);
    if (entry->value.IsNull()) {
      items.clear();
      return;
    }
    if (!entry->value.IsSequence()) {
      sink_.error(
          path, value_loc(*entry),
          "must be a list of maps, e.g. [{key: value}] (got " + describe(entry->value) + ")");
      return;
    }
    std::vector<S> parsed;
    for (size_t i = 0; i < entry->value.size(); ++i) {
      const YAML::Node item_node = entry->value[i];
      const std::string item_path = path + "[" + std::to_string(i) + "]";
      sink_.locations[item_path] = sink_.at(item_node);
      if (!item_node.IsMap()) {
        sink_.error(item_path, sink_.at(item_node),
                    "must be a map of keys (got " + describe(item_node) + ")");
        continue;
      }
      S item{};
      read_struct(item_path, item_node, item);
      parsed.push_back(std::move(item));
    }
    items = std::move(parsed);
  }

  // Call after visit(): every key that no field claimed is an error, with a suggestion.
  void report_unknown_keys() {
    for (const auto& entry : entries_) {
      if (entry.taken) continue;
      if (!entry.key.IsScalar()) {
        sink_.error(prefix_, sink_.at(entry.key),
                    "keys must be plain names (got " + describe(entry.key) + ")");
        continue;
      }
      const std::string name = entry.key.Scalar();
      sink_.error(join_key(prefix_, name), sink_.at(entry.key),
                  "unknown key '" + name + "'" + did_you_mean(prefix_, name, known_));
    }
  }

 private:
  struct Entry {
    YAML::Node key;
    YAML::Node value;
    bool taken;
  };

  // The entry for `key`, marking it (and any repeat of it) as claimed; repeats are errors.
  const Entry* take(const char* key) {
    known_.push_back(key);
    Entry* first = nullptr;
    for (auto& entry : entries_) {
      if (!entry.key.IsScalar() || entry.key.Scalar() != key) continue;
      entry.taken = true;
      if (!first) {
        first = &entry;
        continue;
      }
      const SourceLoc was = sink_.at(first->key);
      sink_.error(join_key(prefix_, key), sink_.at(entry.key),
                  "key given twice (first at line " + std::to_string(was.line) + ", column " +
                      std::to_string(was.column) + ")");
    }
    return first;
  }

  // An empty value (`key:`) has no useful mark of its own (yaml-cpp puts it on the next line).
  SourceLoc value_loc(const Entry& entry) const {
    return sink_.at(entry.value.IsNull() ? entry.key : entry.value);
  }

  template <class S>
  void read_struct(const std::string& path, const YAML::Node& node, S& target) {
    Reader nested(sink_, node, path);
    visit(nested, target);
    nested.report_unknown_keys();
  }

  template <class T>
  bool read_value(const std::string& path, const YAML::Node& node, const SourceLoc& loc, T& out) {
    const std::string problem = convert(node, out);
    if (problem.empty()) return true;
    sink_.error(path, loc, problem);
    return false;
  }

  template <class T>
  bool read_value(const std::string& path, const YAML::Node& node, const SourceLoc& loc,
                  std::vector<T>& out) {
    out.clear();
    if (node.IsNull()) return true;  // `no_decay:` with nothing: an empty list
    if (!node.IsSequence()) {
      sink_.error(path, loc,
                  std::string("must be ") + list_example<T>() + " (got " + describe(node) + ")");
      return false;
    }
    bool ok = true;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node element = node[i];
      T item{};
      if (read_value(path + "[" + std::to_string(i) + "]", element, sink_.at(element), item)) {
        out.push_back(std::move(item));
      } else {
        ok = false;
      }
    }
    return ok;
  }

  // A replaced list's old item locations would point at items that no longer exist.
  void forget_locations_below(const std::string& path) {
    auto it = sink_.locations.lower_bound(path + "[");
    while (it != sink_.locations.end() && it->first.starts_with(path + "["))
      it = sink_.locations.erase(it);
  }

  Sink& sink_;
  std::string prefix_;
  std::vector<Entry> entries_;
  std::vector<std::string> known_;  // the field names of this struct, for did-you-mean
};

// ---- Overrides and the production lock
// -----------------------------------------------------------

std::string trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return "";
  const auto last = s.find_last_not_of(" \t");
  return std::string(s.substr(first, last - first + 1));
}

std::vector<std::string> split_path(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream stream(key);
  for (std::string part; std::getline(stream, part, '.');) parts.push_back(part);
  if (!key.empty() && key.back() == '.') parts.emplace_back();
  return parts;
}

// Why a production config refuses an override of `key`, or "" when the override is allowed. The
// lock is the file's: a --set can neither unlock it (production.* is always locked) nor slip past
// it by overriding a whole section (`--set optim={lr: 1}` touches optim.lr).
std::string lock_refusal(const std::string& key, const ProductionConfig& production) {
  const std::string lock = " (production.locked: true); change it in the config file instead";
  if (key == "faults" || key.starts_with("faults.") || key.starts_with("faults["))
    return "faults are refused in a production config (production.locked: true)";
  if (key_matches("production.*", key) || key == "production")
    return "production settings are always locked in a production config; a --set cannot unlock it";
  for (const auto& pattern : production.locked_keys) {
    if (key_matches(pattern, key))
      return "is locked by production.locked_keys pattern '" + pattern + "'" + lock;
    for (const auto& leaf : all_key_paths()) {
      if (leaf.starts_with(key + ".") && key_matches(pattern, leaf))
        return "covers " + leaf + ", which is locked by production.locked_keys pattern '" +
               pattern + "'" + lock;
    }
  }
  return "";
}

// Applies one "a.b=value" flag (index is 1-based) by reading {a: {b: value}} with the file's
// Reader.
void apply_override(LoadedConfig& out, const std::string& flag, int index,
                    const ProductionConfig& file_production) {
  const SourceLoc loc{kSetFile, 0, index};
  Sink sink{kSetFile, loc, out.locations, out.diagnostics};
  const size_t eq = flag.find('=');
  const std::string key = eq == std::string::npos ? "" : trim(std::string_view(flag).substr(0, eq));
  const std::vector<std::string> segments = split_path(key);
  if (key.empty() ||
      std::any_of(segments.begin(), segments.end(), [](auto& s) { return s.empty(); })) {
    sink.error("", loc, "expected key.path=value, e.g. optim.lr=3e-4 (got '" + flag + "')");
    return;
  }
  if (file_production.locked) {
    if (const std::string refusal = lock_refusal(key, file_production); !refusal.empty()) {
      sink.error(key, loc, refusal);
      return;
    }
  }
  YAML::Node value;
  try {
    value = YAML::Load(flag.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    sink.error(key, loc, "value '" + flag.substr(eq + 1) + "' is not valid YAML: " + e.msg);
    return;
  }
  YAML::Node tree(YAML::NodeType::Map);
  YAML::Node cursor = tree;
  for (size_t i = 0; i + 1 < segments.size(); ++i) {
    YAML::Node next(YAML::NodeType::Map);
    cursor[segments[i]] = next;
    cursor.reset(next);  // rebinds the handle; plain `=` would alias and rewrite the node itself
  }
  cursor[segments.back()] = value;
  Reader reader(sink, tree, "");
  visit(reader, out.config);
  reader.report_unknown_keys();
}

}  // namespace

// ---- Public API
// ----------------------------------------------------------------------------------

std::string Diagnostic::format() const {
  // A --set flag has no line: "--set[N]: error: key: message", N the flag's 1-based position.
  std::string out =
      loc.file == kSetFile
          ? std::string(kSetFile) + "[" + std::to_string(loc.column) + "]"
          : loc.file + ":" + std::to_string(loc.line) + ":" + std::to_string(loc.column);
  out += severity == Severity::kError ? ": error: " : ": warning: ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}

SourceLoc LoadedConfig::where(const std::string& key) const {
  std::string current = key;
  while (!current.empty()) {
    if (const auto it = locations.find(current); it != locations.end()) return it->second;
    const size_t cut = current.find_last_of(".[");
    if (cut == std::string::npos) break;
    current.resize(cut);
  }
  return {path, 1, 1};
}

bool LoadedConfig::has_errors() const {
  return std::any_of(diagnostics.begin(), diagnostics.end(), [](const Diagnostic& d) {
    return d.severity == Diagnostic::Severity::kError;
  });
}

LoadedConfig load_config_from_string(const std::string& yaml_text, const std::string& name,
                                     const std::vector<std::string>& overrides) {
  LoadedConfig out;
  out.path = name;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    const int column = e.mark.is_null() ? 1 : e.mark.column + 1;
    throw ConfigError(name + ":" + std::to_string(line) + ":" + std::to_string(column) +
                      ": error: not valid YAML: " + e.msg);
  }
  Sink sink{name, std::nullopt, out.locations, out.diagnostics};
  if (root.IsMap()) {
    Reader reader(sink, root, "");
    visit(reader, out.config);
    reader.report_unknown_keys();
  } else if (!root.IsNull()) {  // an empty file is a valid config: all defaults
    sink.error(
        "", sink.at(root),
        "a config must be a map of sections (run:, model:, ...) (got " + describe(root) + ")");
  }
  const ProductionConfig file_production = out.config.production;
  for (size_t i = 0; i < overrides.size(); ++i) {
    apply_override(out, overrides[i], static_cast<int>(i) + 1, file_production);
  }
  if ((file_production.locked || out.config.production.locked) && !out.config.faults.empty()) {
    sink.error("faults", out.where("faults"),
               "faults are refused in a production config (production.locked: true); remove the "
               "faults list, or drop the lock for a test run");
  }
  // File diagnostics in line order (visit order is schema order), then the flags in order.
  std::stable_sort(out.diagnostics.begin(), out.diagnostics.end(),
                   [](const Diagnostic& a, const Diagnostic& b) {
                     return std::make_tuple(a.loc.file == kSetFile, a.loc.line, a.loc.column) <
                            std::make_tuple(b.loc.file == kSetFile, b.loc.line, b.loc.column);
                   });
  return out;
}

namespace {

// A config file beside `path` that it most likely meant (tiny.yml for tiny.yaml): " HINT: did you
// mean ...?", or the usual hint.
// The config files (.yaml, .yml) in `dir`, by name, sorted.
std::vector<std::string> config_files_in(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) &&
        (e.path().extension() == ".yaml" || e.path().extension() == ".yml"))
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string missing_config_hint(const std::string& path) {
  const std::filesystem::path given(path);
  const std::filesystem::path dir = given.has_parent_path() ? given.parent_path() : ".";
  if (auto near = closest_word(given.filename().string(), config_files_in(dir)))
    return ". HINT: did you mean " + (dir / *near).string() + "?";
  return ". HINT: check the path; `keel validate` takes the YAML file itself";
}

}  // namespace

LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // it opens, and reads as an empty config
    std::string configs;
    for (const auto& name : config_files_in(path))
      configs += (configs.empty() ? "" : ", ") + (std::filesystem::path(path) / name).string();
    throw ConfigError(path + ": a directory, not a config file. HINT: give the YAML file itself" +
                      (configs.empty() ? std::string() : " (" + configs + ")"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    const std::string reason = std::strerror(errno);
    throw ConfigError(path + ": cannot read the config file (" + reason + ")" +
                      relative_note(path) + missing_config_hint(path));
  }
  std::stringstream text;
  text << file.rdbuf();
  return load_config_from_string(text.str(), path, overrides);
}

}  // namespace keel::config
