#include "data/spacy_en_words.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "data/hf_regex.h"
#include "spacy_en_rules.inc"

namespace keel::data {
namespace {

using Piece = std::pair<uint32_t, uint32_t>;  // [begin, end) bytes of a span

// Lets a map keyed by std::string be searched with a string_view, without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct Rules {
  HfRegex prefix{kSpacyEnPrefix, "spaCy's English prefixes"};
  HfRegex suffix{kSpacyEnSuffix, "spaCy's English suffixes"};
  HfRegex infix{kSpacyEnInfix, "spaCy's English infixes"};
  std::unordered_map<std::string_view, std::vector<uint32_t>> specials;  // piece lengths
  // The special cases spaCy's second pass (_apply_special_cases) looks for: those its affix rules
  // would split, as the words they split into, by their first word.
  using Phrase = std::vector<std::string>;
  StringMap<std::vector<Phrase>> phrases;
  bool phrase_starts[256] = {};  // the first bytes of their first words

  Rules() {
    for (const auto& [text, pieces] : kSpacyEnSpecials) {
      std::vector<uint32_t>& lengths = specials[text];
      const std::string_view all(pieces);
      for (size_t begin = 0;;) {
        const size_t end = all.find('\037', begin);
        lengths.push_back(static_cast<uint32_t>((end == all.npos ? all.size() : end) - begin));
        if (end == all.npos) break;
        begin = end + 1;
      }
    }
    add_phrases();
  }
  void add_phrases();
  const std::vector<uint32_t>* special(std::string_view s) const {
    const auto it = specials.find(s);
    return it == specials.end() ? nullptr : &it->second;
  }
};

const Rules& rules() {
  static const Rules r;
  return r;
}

// The length of the first match of `re` in `s` (re.search), 0 when none.
size_t first_match_length(const HfRegex& re, std::string_view s) {
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(s, m);
  return m.empty() ? 0 : m.front().second - m.front().first;
}

void push_special(const std::vector<uint32_t>& lengths, uint32_t at, std::vector<Piece>& out) {
  for (uint32_t n : lengths) {
    out.emplace_back(at, at + n);
    at += n;
  }
}

// _attach_tokens for the core [b, e) of `span`: a special case, else split at the infixes (one at
// the core's very start is not a split).
void attach_core(const Rules& r, std::string_view span, uint32_t b, uint32_t e, bool specials,
                 std::vector<Piece>& out) {
  const std::string_view core = span.substr(b, e - b);
  if (const auto* lengths = specials ? r.special(core) : nullptr)
    return push_special(*lengths, b, out);
  std::vector<std::pair<size_t, size_t>> infixes;
  r.infix.find_all(core, infixes);
  uint32_t start = 0;
  for (const auto& [ib, ie] : infixes) {
    if (ib == 0) continue;
    if (ib != start) out.emplace_back(b + start, b + static_cast<uint32_t>(ib));
    if (ie != ib) out.emplace_back(b + static_cast<uint32_t>(ib), b + static_cast<uint32_t>(ie));
    start = static_cast<uint32_t>(ie);
  }
  if (b + start < e) out.emplace_back(b + start, e);
}

// spaCy's _split_affixes and _attach_tokens over one span without whitespace; without the special
// cases as its second pass needs them.
std::vector<Piece> split_span(const Rules& r, std::string_view span, bool specials = true) {
  std::vector<Piece> out;
  const auto special = [&](std::string_view s) { return specials ? r.special(s) : nullptr; };
  if (const auto* lengths = special(span)) {
    push_special(*lengths, 0, out);
    return out;
  }
  std::vector<Piece> prefixes, suffixes;
  uint32_t b = 0, e = static_cast<uint32_t>(span.size());  // the rest: span[b, e)
  size_t last_size = 0;
  auto rest = [&] { return span.substr(b, e - b); };
  while (e > b && e - b != last_size) {
    if (special(rest())) break;
    last_size = e - b;
    const auto pre = static_cast<uint32_t>(first_match_length(r.prefix, rest()));
    if (pre != 0 && e - b > pre && special(span.substr(b + pre, e - b - pre))) {
      prefixes.emplace_back(b, b + pre);
      b += pre;
      break;
    }
    const auto suf = static_cast<uint32_t>(first_match_length(r.suffix, rest().substr(pre)));
    if (suf != 0 && e - b > suf && special(span.substr(b, e - b - suf))) {
      suffixes.emplace_back(e - suf, e);
      e -= suf;
      break;
    }
    if (pre != 0 && suf != 0 && pre + suf <= e - b) {
      prefixes.emplace_back(b, b + pre);
      suffixes.emplace_back(e - suf, e);
      b += pre;
      e -= suf;
    } else if (pre != 0) {
      prefixes.emplace_back(b, b + pre);
      b += pre;
    } else if (suf != 0) {
      suffixes.emplace_back(e - suf, e);
      e -= suf;
    }
  }
  out = prefixes;
  if (e > b) attach_core(r, span, b, e, specials, out);
  out.insert(out.end(), suffixes.rbegin(), suffixes.rend());
  return out;
}

// Which special cases the second pass looks for: add_special_case's test (an affix rule matches the
// text, or it holds a space). Those with whitespace cannot match words, which hold none.
void Rules::add_phrases() {
  for (const auto& [text, pieces] : kSpacyEnSpecials) {
    const std::string_view t(text);
    if (t.find_first_of(" \t\n") != t.npos) continue;
    std::vector<std::pair<size_t, size_t>> infixes;
    infix.find_all(t, infixes);
    if (first_match_length(prefix, t) == 0 && first_match_length(suffix, t) == 0 && infixes.empty())
      continue;
    Phrase phrase;
    for (const auto& [b, e] : split_span(*this, t, false)) phrase.emplace_back(t.substr(b, e - b));
    phrase_starts[static_cast<unsigned char>(phrase.front()[0])] = true;
    phrases[phrase.front()].push_back(std::move(phrase));
  }
}

// _apply_special_cases: runs of words that spell a special case's words are matched, the longest
// (then the earliest) first and none overlapping another's first or last word; a match whose
// text, spaces included, is the special case becomes its pieces.
void apply_phrases(const Rules& r, std::string_view text, std::vector<Piece>& words) {
  struct Match {
    size_t start, end;
  };
  std::vector<Match> matches;
  for (size_t i = 0; i < words.size(); ++i) {
    if (!r.phrase_starts[static_cast<unsigned char>(text[words[i].first])]) continue;
    const auto it = r.phrases.find(text.substr(words[i].first, words[i].second - words[i].first));
    if (it == r.phrases.end()) continue;
    for (const Rules::Phrase& p : it->second) {
      if (i + p.size() > words.size()) continue;
      bool same = true;
      for (size_t k = 1; k < p.size() && same; ++k) {
        const Piece& w = words[i + k];
        same = text.substr(w.first, w.second - w.first) == p[k];
      }
      if (same) matches.push_back({i, i + p.size()});
    }
  }
  if (matches.empty()) return;
  std::stable_sort(matches.begin(), matches.end(), [](const Match& a, const Match& b) {
    const size_t la = a.end - a.start, lb = b.end - b.start;
    return la != lb ? la > lb : a.start < b.start;
  });
  std::vector<bool> seen(words.size(), false);
  std::vector<Match> kept;
  for (const Match& m : matches) {
    if (!seen[m.start] && !seen[m.end - 1]) kept.push_back(m);
    for (size_t k = m.start; k < m.end; ++k) seen[k] = true;
  }
  std::sort(kept.begin(), kept.end(),
            [](const Match& a, const Match& b) { return a.start < b.start; });
  std::vector<Piece> out;
  size_t next = 0;
  for (const Match& m : kept) {
    out.insert(out.end(), words.begin() + static_cast<std::ptrdiff_t>(next),
               words.begin() + static_cast<std::ptrdiff_t>(m.start));
    const uint32_t b = words[m.start].first, e = words[m.end - 1].second;
    const auto* lengths = r.special(text.substr(b, e - b));
    if (lengths) {
      push_special(*lengths, b, out);
    } else {
      out.insert(out.end(), words.begin() + static_cast<std::ptrdiff_t>(m.start),
                 words.begin() + static_cast<std::ptrdiff_t>(m.end));
    }
    next = m.end;
  }
  out.insert(out.end(), words.begin() + static_cast<std::ptrdiff_t>(next), words.end());
  words = std::move(out);
}

bool valid_utf8_span(std::string_view s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

// The spans split so far, shared by the threads (a prepare's workers are new threads for every
// block of documents): sharded, so that they seldom wait for each other.
class SpanCache {
 public:
  // `span`'s pieces, split by `split` on a miss.
  template <class Split>
  std::vector<Piece> get(std::string_view span, const Split& split) {
    Shard& shard = shards_[StringHash{}(span) % kShards];
    {
      std::lock_guard<std::mutex> lock(shard.mu);
      const auto it = shard.spans.find(span);
      if (it != shard.spans.end()) return it->second;
    }
    std::vector<Piece> pieces = split(span);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.spans.size() >= kSpansPerShard) shard.spans.clear();
    shard.spans.emplace(std::string(span), pieces);
    return pieces;
  }

 private:
  static constexpr size_t kShards = 64, kSpansPerShard = size_t{1} << 14;
  struct Shard {
    std::mutex mu;
    StringMap<std::vector<Piece>> spans;
  };
  Shard shards_[kShards];
};

}  // namespace

void spacy_en_words(std::string_view simplified, std::vector<std::string_view>& out) {
  const Rules& r = rules();
  static SpanCache cache;
  const auto split = [&](std::string_view span) { return split_span(r, span); };
  // [begin, end) bytes of `simplified`: the words, and as spaCy has them, the spaces of a run but
  // its first (they keep a special case's words apart in its second pass; dropped at the end).
  std::vector<Piece> words;
  const bool whole = simplified.size() < UINT32_MAX;  // Piece's offsets are 32-bit
  for (size_t i = 0; i < simplified.size();) {
    if (simplified[i] == ' ') {
      const size_t j = simplified.find_first_not_of(' ', i);
      const size_t end = j == simplified.npos ? simplified.size() : j;
      const size_t from = words.empty() ? i : i + 1;
      if (whole && end > from) words.emplace_back(from, end);
      i = end;
      continue;
    }
    size_t j = simplified.find(' ', i);
    if (j == simplified.npos) j = simplified.size();
    const std::string_view span = simplified.substr(i, j - i);
    const auto at = static_cast<uint32_t>(i);
    i = j;
    if (!whole) {
      out.push_back(span);
    } else if (!valid_utf8_span(span)) {
      words.emplace_back(at, at + static_cast<uint32_t>(span.size()));
    } else {
      for (const auto& [b, e] : cache.get(span, split)) words.emplace_back(at + b, at + e);
    }
  }
  apply_phrases(r, simplified, words);
  for (const auto& [b, e] : words)
    if (simplified[b] != ' ') out.push_back(simplified.substr(b, e - b));
}

}  // namespace keel::data
