#include "config/key_paths.h"

#include "config/fields.h"
#include "config/load.h"

namespace keel::config {

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string parent_of(const std::string& path) {
  const size_t cut = path.find_last_of('.');
  return cut == std::string::npos ? "" : path.substr(0, cut);
}

std::string last_segment(const std::string& path) {
  const size_t cut = path.find_last_of('.');
  return cut == std::string::npos ? path : path.substr(cut + 1);
}

namespace {

// ---- Key listing
// ---------------------------------------------------------------------------------

// Collects dotted paths: scalar fields and lists always, sections too when asked (for suggestions,
// where a misplaced section name such as `loader` at the top level should find data.loader).
class KeyLister {
 public:
  KeyLister(std::vector<std::string>& out, std::string prefix, bool with_sections)
      : out_(out), prefix_(std::move(prefix)), with_sections_(with_sections) {}

  template <class T>
  void field(const char* key, T&) {
    out_.push_back(join_key(prefix_, key));
  }
  void field(const char* key, int64_t& value, AutoAllowed) { field(key, value); }
  template <class S>
  void section(const char* key, S& sub) {
    const std::string path = join_key(prefix_, key);
    if (with_sections_) out_.push_back(path);
    KeyLister nested(out_, path, with_sections_);
    visit(nested, sub);
  }
  template <class S>
  void list(const char* key, std::vector<S>&) {
    out_.push_back(join_key(prefix_, key));
  }

 private:
  std::vector<std::string>& out_;
  std::string prefix_;
  bool with_sections_;
};

}  // namespace

const std::vector<std::string>& schema_paths_with_sections() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> out;
    Config scratch;
    KeyLister lister(out, "", true);
    visit(lister, scratch);
    return out;
  }();
  return paths;
}

std::vector<std::string> all_key_paths() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> out;
    Config scratch;
    KeyLister lister(out, "", false);
    visit(lister, scratch);
    return out;
  }();
  return paths;
}

bool key_matches(const std::string& pattern, const std::string& key) {
  if (pattern == key || pattern == "*") return true;
  if (pattern.size() >= 2 && pattern.ends_with(".*")) {
    // "optim.*" covers optim.lr, optim.betas and anything nested deeper
    // (stability.rollback.enabled).
    return key.starts_with(pattern.substr(0, pattern.size() - 1));
  }
  return false;
}

}  // namespace keel::config
