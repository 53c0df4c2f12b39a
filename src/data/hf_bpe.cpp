#include "data/hf_bpe.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <queue>
#include <sstream>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "common/error.h"
#include "data/bounded_json.h"
#include "data/hf_regex.h"
#include "data/hf_tokenizer.h"

namespace keel::data {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

// The pattern ByteLevel splits with when use_regex is on (tokenizers' byte_level.rs).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreStep {
  std::shared_ptr<HfRegex> regex;  // null: a ByteLevel without use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool byte_level = false;  // ByteLevel: prefix space, split, then bytes to GPT-2's characters
  bool add_prefix_space = false;
};

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct Merge {
  uint32_t rank, new_id;
};

// Rust's char::is_whitespace: Unicode White_Space.
bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// tokenizers' is_word_character: alphanumeric or '_'.
bool is_word_character(uint32_t cp) {
  if (cp == '_') return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// One piece of a document on its way through: text still to tokenize, or an added token's id.
struct Piece {
  std::string text;
  int64_t added_id = -1;
};

std::atomic<uint64_t> next_serial{1};

// Parses and runs one tokenizer.json; see hf_bpe.h for what it covers.
class HfBpeTokenizer : public Tokenizer {
 public:
  HfBpeTokenizer(const std::string& path, const json& j, const std::string& boundary_token);
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  std::string decode(const int64_t* ids, size_t n) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  uint32_t boundary_id() const override { return boundary_id_; }
  nlohmann::json describe() const override {
    return {{"kind", "hf"},
            {"file", "tokenizer.json"},
            {"vocab_size", vocab_size()},
            {"boundary_id", boundary_id_},
            {"boundary_token", id_to_token_[boundary_id_]}};
  }

 private:
  void parse_normalizer(const json& n);
  void parse_pre_tokenizer(const json& p);
  void parse_model(const json& m);
  void parse_added(const json& added);
  void choose_boundary(const std::string& boundary_token);
  // A token id as tokenizers reads one: an integer in u32, no cast from a float, a bool or a
  // negative number; and below max_id_, so that no table is sized by a number in the file.
  uint32_t token_id(const json& id, const std::string& key) const {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > std::numeric_limits<uint32_t>::max())
      refuse_file(key + " is " + id.dump() + ", not a token id (an integer from 0 to 4294967295)");
    const uint64_t v = id.get<uint64_t>();
    if (v >= max_id_)
      refuse_file(key + " is " + std::to_string(v) + ", far past the " +
                  std::to_string(max_id_ - kIdSlack) + " tokens the file lists (ids up to " +
                  std::to_string(max_id_ - 1) + " are read)");
    return static_cast<uint32_t>(v);
  }
  // A file that is not a well-formed tokenizer.json (as opposed to one keel does not run).
  [[noreturn]] void refuse_file(const std::string& what) const {
    throw DataError(path_ + ": " + what + "\nHINT: a tokenizer.json that the tokenizers library " +
                    "itself writes (tokenizer.save) has none of these");
  }
  [[noreturn]] void refuse(const std::string& what) const {
    throw DataError(path_ + ": " + what +
                    "; keel runs BPE models with no normalizer or NFC, and Split, ByteLevel and "
                    "Digits pre-tokenizers (GPT-2, Llama-3, Qwen and cl100k-style tokenizers)");
  }
  void split_added(std::vector<Piece>& pieces, bool normalized) const;
  std::string normalize(std::string text) const;
  void pre_tokenize(std::string text, std::vector<std::string>& words) const;
  void bpe(std::string_view word, std::vector<uint32_t>& out) const;
  void merge_word(std::string_view word, std::vector<uint32_t>& out) const;

  std::string path_;
  bool nfc_ = false;
  std::vector<PreStep> steps_;
  Vocab vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank, merged id
  std::optional<uint32_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  std::vector<AddedToken> added_;
  // Per normalized flag and first byte: indices into added_, longest first.
  std::array<std::array<std::vector<size_t>, 256>, 2> added_by_first_byte_;
  std::vector<std::string> id_to_token_;
  uint32_t boundary_id_ = 0;
  // Ids are read below max_id_: the file's tokens (vocab and added) plus kIdSlack. Real files
  // number their tokens densely, with a few reserved gaps; one id of 1e8 among a handful of tokens
  // would otherwise size the id table at gigabytes.
  static constexpr uint64_t kIdSlack = 65536;
  uint64_t max_id_ = kIdSlack;
  bool byte_level_decoder_ = false;
  uint64_t serial_ = next_serial++;
};

HfBpeTokenizer::HfBpeTokenizer(const std::string& path, const json& j,
                               const std::string& boundary_token)
    : path_(path) {
  // A value of the wrong type deep in a section: the section named, not nlohmann's text alone.
  const auto section = [this](const char* key, const auto& parse) {
    try {
      parse();
    } catch (const json::exception& e) {  // "[json.exception.type_error.302] type must be ..."
      const std::string what = e.what(), text = what.substr(what.find("] ") + 2);
      refuse_file(std::string("in \"") + key + "\": " + (what[0] == '[' ? text : what));
    }
  };
  section("normalizer", [&] { parse_normalizer(j.value("normalizer", json())); });
  section("pre_tokenizer", [&] { parse_pre_tokenizer(j.value("pre_tokenizer", json())); });
  const json added = j.value("added_tokens", json::array());
  if (!added.is_array()) refuse_file("added_tokens is not a list");
  max_id_ = added.size() + kIdSlack;  // parse_model adds the vocabulary's size
  section("model", [&] { parse_model(j.at("model")); });
  section("added_tokens", [&] { parse_added(added); });
  const json decoder = j.value("decoder", json());
  byte_level_decoder_ = decoder.dump().find("\"ByteLevel\"") != std::string::npos;
  choose_boundary(boundary_token);
}

void HfBpeTokenizer::parse_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    nfc_ = true;
  } else if (type == "Sequence") {
    for (const json& each : n.at("normalizers")) parse_normalizer(each);
  } else {
    refuse("the normalizer " + type + " is not supported");
  }
}

void HfBpeTokenizer::parse_pre_tokenizer(const json& p) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  PreStep step;
  if (type == "Sequence") {
    for (const json& each : p.at("pretokenizers")) parse_pre_tokenizer(each);
    return;
  }
  if (type == "Split") {
    const json& pattern = p.at("pattern");
    const std::string regex = pattern.contains("Regex")
                                  ? pattern.at("Regex").get<std::string>()
                                  : regex_escape(pattern.at("String").get<std::string>());
    if (regex.empty()) refuse("a Split pre-tokenizer with an empty pattern");
    step.regex = std::make_shared<HfRegex>(regex, path_ + ": pre_tokenizer Split");
    static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    const auto it = kBehaviors.find(p.value("behavior", ""));
    if (it == kBehaviors.end()) refuse("a Split behavior " + p.value("behavior", "(none)"));
    step.behavior = it->second;
    step.invert = p.value("invert", false);
  } else if (type == "ByteLevel") {
    step.byte_level = true;
    step.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true))
      step.regex = std::make_shared<HfRegex>(kGpt2Pattern, path_ + ": ByteLevel");
  } else if (type == "Digits") {
    const bool individual = p.value("individual_digits", false);
    step.regex = std::make_shared<HfRegex>("\\p{N}", path_ + ": Digits");
    step.behavior = individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else {
    refuse("the pre-tokenizer " + type + " is not supported");
  }
  steps_.push_back(std::move(step));
}

void HfBpeTokenizer::parse_model(const json& m) {
  if (m.value("type", "BPE") != "BPE") refuse("the model " + m.value("type", "") + " is not BPE");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    refuse("BPE dropout (random merges) cannot give a reproducible dataset");
  auto text = [&](const char* key) {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  prefix_ = text("continuing_subword_prefix");
  suffix_ = text("end_of_word_suffix");
  fuse_unk_ = m.value("fuse_unk", false);
  byte_fallback_ = m.value("byte_fallback", false);
  ignore_merges_ = m.value("ignore_merges", false);
  const json& vocab = m.at("vocab");
  if (!vocab.is_object()) refuse_file("model.vocab is not an object of token: id");
  max_id_ += vocab.size();
  for (const auto& [token, id] : vocab.items()) {
    const uint32_t v = token_id(id, "model.vocab[" + json(token).dump() + "]");
    vocab_[token] = v;
    if (v >= id_to_token_.size()) id_to_token_.resize(v + 1);
    id_to_token_[v] = token;
  }
  if (const std::string unk = text("unk_token"); !unk.empty()) {
    const auto it = vocab_.find(unk);
    if (it == vocab_.end()) refuse("the unk_token " + unk + " is not in the vocabulary");
    unk_id_ = it->second;
  }
  const json& merges = m.at("merges");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string left, right;
    if (merges[rank].is_array()) {
      left = merges[rank].at(0).get<std::string>();
      right = merges[rank].at(1).get<std::string>();
    } else {
      const std::string pair = merges[rank].get<std::string>();
      const size_t space = pair.find(' ');
      if (space == std::string::npos || pair.find(' ', space + 1) != std::string::npos)
        refuse("merge " + std::to_string(rank) + " '" + pair + "' is not two tokens");
      left = pair.substr(0, space);
      right = pair.substr(space + 1);
    }
    const auto l = vocab_.find(left), r = vocab_.find(right);
    const std::string merged = left + right.substr(std::min(prefix_.size(), right.size()));
    const auto n = vocab_.find(merged);
    if (l == vocab_.end() || r == vocab_.end() || n == vocab_.end())
      refuse("merge " + std::to_string(rank) + " names a token not in the vocabulary");
    merges_[(uint64_t{l->second} << 32) | r->second] = {static_cast<uint32_t>(rank), n->second};
  }
}

void HfBpeTokenizer::parse_added(const json& added) {
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    AddedToken a;
    a.content = t.at("content").get<std::string>();
    a.id = token_id(t.at("id"), key + ".id");
    if (const auto it = vocab_.find(a.content); it != vocab_.end() && it->second != a.id)
      refuse_file(key + " " + json(a.content).dump() + " has id " + std::to_string(a.id) +
                  " but model.vocab gives it " + std::to_string(it->second));
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    if (a.content.empty()) continue;
    if (a.id >= id_to_token_.size()) id_to_token_.resize(a.id + 1);
    id_to_token_[a.id] = a.content;
    added_.push_back(std::move(a));
  }
  // Longest first: the scan in split_added takes the first that matches at a position.
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_first_byte_[added_[i].normalized][static_cast<unsigned char>(added_[i].content[0])]
        .push_back(i);
}

void HfBpeTokenizer::choose_boundary(const std::string& boundary_token) {
  std::string wanted = boundary_token;
  const fs::path config = fs::path(path_).parent_path() / "tokenizer_config.json";
  if (wanted.empty() && fs::is_regular_file(config)) {
    std::ifstream in(config);
    const json c = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (c.is_object() && c.contains("eos_token")) {
      const json& eos = c["eos_token"];
      if (eos.is_string()) wanted = eos.get<std::string>();
      if (eos.is_object() && eos.contains("content")) wanted = eos["content"].get<std::string>();
    }
  }
  const std::vector<std::string> known = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
  for (const std::string& name : wanted.empty() ? known : std::vector<std::string>{wanted}) {
    for (const AddedToken& a : added_)
      if (a.content == name) {
        boundary_id_ = a.id;
        return;
      }
    if (const auto it = vocab_.find(name); it != vocab_.end() && !wanted.empty()) {
      boundary_id_ = it->second;
      return;
    }
  }
  throw DataError(path_ + ": no document boundary token" +
                  (wanted.empty() ? std::string(" (none of <|endoftext|>, <|end_of_text|>, </s>, "
                                                "<eos> is a special token here)")
                                  : " (the eos_token " + wanted + " is not in it)") +
                  "; HINT: put a tokenizer_config.json with \"eos_token\" beside it");
}

// Leftmost-longest matches of the added tokens (those with `normalized` as given) in each text
// piece, as tokenizers' AddedVocabulary splits them out.
void HfBpeTokenizer::split_added(std::vector<Piece>& pieces, bool normalized) const {
  std::vector<Piece> out;
  for (Piece& piece : pieces) {
    if (piece.added_id >= 0) {
      out.push_back(std::move(piece));
      continue;
    }
    const std::string_view s = piece.text;
    size_t start_offset = 0, pos = 0;
    while (pos < s.size()) {
      const AddedToken* found = nullptr;
      for (size_t i : added_by_first_byte_[normalized][static_cast<unsigned char>(s[pos])])
        if (s.compare(pos, added_[i].content.size(), added_[i].content) == 0) {
          found = &added_[i];
          break;
        }
      size_t step = 0;
      utf8_at(s, pos, &step);
      if (!found) {
        pos += step;
        continue;
      }
      size_t begin = pos, end = pos + found->content.size();
      if (found->single_word) {
        size_t len = 0;
        const bool word_before =
            begin > 0 && is_word_character(utf8_at(s, utf8_before(s, begin), &len));
        const bool word_after = end < s.size() && is_word_character(utf8_at(s, end, &len));
        if (word_before || word_after) {
          pos += step;
          continue;
        }
      }
      if (found->lstrip) {
        size_t len = 0;
        while (begin > start_offset && is_whitespace(utf8_at(s, utf8_before(s, begin), &len)))
          begin = utf8_before(s, begin);
      }
      if (found->rstrip) {
        size_t len = 0;
        while (end < s.size() && is_whitespace(utf8_at(s, end, &len))) end += len;
      }
      if (begin > start_offset)
        out.push_back({std::string(s.substr(start_offset, begin - start_offset))});
      out.push_back({std::string(), found->id});
      start_offset = pos = end;
    }
    if (start_offset < s.size()) out.push_back({std::string(s.substr(start_offset))});
  }
  pieces = std::move(out);
}

std::string HfBpeTokenizer::normalize(std::string text) const {
  if (!nfc_ || std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; }))
    return text;  // ASCII is its own NFC
  utf8proc_uint8_t* composed = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &composed,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return text;  // valid UTF-8 by now: never
  std::string out(reinterpret_cast<char*>(composed), static_cast<size_t>(n));
  std::free(composed);
  return out;
}

// Each step splits every piece the previous one left (tokenizers' PreTokenizedString::split).
void HfBpeTokenizer::pre_tokenize(std::string text, std::vector<std::string>& words) const {
  std::vector<std::string> pieces{std::move(text)}, next;
  for (const PreStep& step : steps_) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.add_prefix_space && piece.rfind(' ', 0) != 0) piece.insert(0, 1, ' ');
      std::vector<std::string> parts;
      if (!step.regex) {
        parts.push_back(std::move(piece));
      } else {
        split_pieces(*step.regex, piece, step.behavior, step.invert, parts);
      }
      for (std::string& part : parts) {
        if (step.byte_level) {
          std::string mapped;
          for (unsigned char c : part) mapped += gpt2_byte_chars()[c];
          part = std::move(mapped);
        }
        if (!part.empty()) next.push_back(std::move(part));
      }
    }
    std::swap(pieces, next);
  }
  for (std::string& p : pieces) words.push_back(std::move(p));
}

void HfBpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  std::vector<Piece> pieces{{valid_utf8(text)}};
  split_added(pieces, /*normalized=*/false);
  for (Piece& p : pieces)
    if (p.added_id < 0) p.text = normalize(std::move(p.text));
  split_added(pieces, /*normalized=*/true);
  std::vector<std::string> words;
  for (Piece& p : pieces) {
    if (p.added_id >= 0) {
      out.push_back(static_cast<uint32_t>(p.added_id));
      continue;
    }
    words.clear();
    pre_tokenize(std::move(p.text), words);
    for (const std::string& w : words) bpe(w, out);
  }
}

// tokenizers' BPE::tokenize_with_cache: a word already in the vocabulary is one token when
// ignore_merges is set; otherwise merged, and the result kept in this thread's cache.
void HfBpeTokenizer::bpe(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_)
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  struct Cache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> words;
  };
  thread_local Cache cache;
  constexpr size_t kCacheWords = 1 << 17;
  if (cache.owner != serial_ || cache.words.size() >= kCacheWords) {
    cache.words.clear();
    cache.owner = serial_;
  }
  if (const auto it = cache.words.find(word); it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<uint32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() < 256) cache.words.emplace(std::string(word), std::move(ids));
}

// tokenizers' BPE::merge_word and Word::merge_all: characters to symbols (byte fallback, unk),
// then the lowest-ranked adjacent pair merged first, the leftmost among equal ranks.
void HfBpeTokenizer::merge_word(std::string_view w, std::vector<uint32_t>& out) const {
  std::vector<uint32_t> symbols;
  std::optional<uint32_t> unk;  // pending, fused with the next unknown character when fuse_unk
  for (size_t i = 0; i < w.size();) {
    size_t len = 0;
    utf8_at(w, i, &len);
    std::string s(w.substr(i, len));
    if (i > 0) s = prefix_ + s;
    if (i + len == w.size()) s += suffix_;
    i += len;
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (unk) symbols.push_back(*std::exchange(unk, std::nullopt));
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<uint32_t> bytes;
      for (unsigned char b : s) {
        char code[8];
        std::snprintf(code, sizeof code, "<0x%02X>", b);
        const auto it = vocab_.find(std::string_view(code));
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == s.size()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_id_) {
      if (unk && !fuse_unk_) symbols.push_back(*unk);
      unk = unk_id_;
    }
  }
  if (unk) symbols.push_back(*unk);
  // A doubly linked list over the symbols and a queue of candidate merges, (rank, position)
  // smallest first; a candidate whose pair has changed since it was queued is dropped.
  const auto n = static_cast<int64_t>(symbols.size());
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int64_t k = 0; k < n; ++k) prev[k] = k - 1, next[k] = k + 1 < n ? k + 1 : -1;
  using Candidate = std::tuple<uint32_t, int64_t, uint32_t>;  // rank, position, merged id
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int64_t left) {
    if (left < 0 || next[left] < 0) return;
    const auto it = merges_.find((uint64_t{symbols[left]} << 32) | symbols[next[left]]);
    if (it != merges_.end()) queue.emplace(it->second.rank, left, it->second.new_id);
  };
  for (int64_t k = 0; k + 1 < n; ++k) consider(k);
  while (!queue.empty()) {
    const auto [rank, left, merged] = queue.top();
    queue.pop();
    if (!alive[left] || next[left] < 0) continue;
    const auto it = merges_.find((uint64_t{symbols[left]} << 32) | symbols[next[left]]);
    if (it == merges_.end() || it->second.new_id != merged) continue;
    const int64_t right = next[left];
    symbols[left] = merged;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    consider(prev[left]);
    consider(left);
  }
  for (int64_t k = 0; k < n; ++k)
    if (alive[k]) out.push_back(symbols[k]);
}

std::string HfBpeTokenizer::decode(const int64_t* ids, size_t n) const {
  static const std::unordered_map<std::string, char> kBytes = [] {
    std::unordered_map<std::string, char> m;
    for (int b = 0; b < 256; ++b) m[gpt2_byte_chars()[b]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (size_t k = 0; k < n; ++k) {
    if (ids[k] < 0 || ids[k] >= vocab_size() || id_to_token_[ids[k]].empty()) {
      out += "<?" + std::to_string(ids[k]) + ">";
      continue;
    }
    const std::string& token = id_to_token_[ids[k]];
    unsigned byte = 0;
    if (byte_fallback_ && token.size() == 6 && std::sscanf(token.c_str(), "<0x%2X>", &byte) == 1) {
      out += static_cast<char>(byte);
      continue;
    }
    if (!byte_level_decoder_) {
      out += token;
      continue;
    }
    for (size_t i = 0; i < token.size();) {
      size_t len = 0;
      utf8_at(token, i, &len);
      const auto it = kBytes.find(token.substr(i, len));
      out += it != kBytes.end() ? std::string(1, it->second) : token.substr(i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path,
                                             const std::string& boundary_token) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot be read (expected a Hugging Face tokenizer.json)");
  // A real tokenizer.json nests a handful of levels; its pieces are walked recursively.
  const json j = parse_bounded_json(in, path, /*max_depth=*/64,
                                    "use the tokenizer.json of the model's own repository");
  if (!j.is_object() || !j.contains("model"))
    throw DataError(path + ": not a Hugging Face tokenizer.json (no \"model\")");
  try {
    return std::make_unique<HfBpeTokenizer>(path, j, boundary_token);
  } catch (const json::exception& e) {
    throw DataError(path + ": " + e.what());
  }
}

}  // namespace keel::data
