#include "data/hf_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include <fmt/format.h>

#include "common/error.h"

namespace keel::data {
namespace {

// Oniguruma's \s (Unicode White_Space) in PCRE2's terms: PCRE2's \s under UCP lacks U+0085.
std::string oniguruma_classes(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's')
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (next == 'S' && !in_class)
        out += "[^\\s\\x{85}]";
      else
        out += {c, next};
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class: [:alpha:]
      if (end != std::string::npos) {
        out += pattern.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// What one pattern may take over one document: how far a match may look past where it starts, and
// how long it may run in all. Real pre-tokenizer patterns look a character or two ahead; a piece
// of 64 KiB (a run of letters or spaces that long) is not text, and is refused naming where.
constexpr size_t kRegexWindow = size_t{64} << 10;
constexpr std::chrono::seconds kRegexBudget{60};

// A pattern of a hostile file can be long: its start names it well enough.
std::string shown(const std::string& pattern) {
  return pattern.size() <= 200
             ? pattern
             : pattern.substr(0, 200) + "... (" + std::to_string(pattern.size()) + " bytes)";
}

}  // namespace

// MULTILINE: Oniguruma's default (Ruby) syntax makes ^ and $ line anchors, and cl100k's pattern
// ends a whitespace run at a line end with \s++$.
HfRegex::HfRegex(const std::string& pattern, const std::string& where) : where_(where) {
  const std::string translated = oniguruma_classes(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK, &error,
                        &offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw DataError(where + ": the pattern " + shown(pattern) +
                    " cannot be compiled (PCRE2: " + reinterpret_cast<const char*>(message) +
                    " at offset " + std::to_string(offset) + ")");
  }
  // tokenizers splits around an empty match where keel's find_all steps over it: the pieces would
  // differ, so a pattern that can match nothing at all is refused, not run differently.
  uint32_t match_empty = 0;
  pcre2_pattern_info(code_, PCRE2_INFO_MATCHEMPTY, &match_empty);
  if (match_empty) {
    pcre2_code_free(code_);
    code_ = nullptr;
    throw DataError(where + ": the pattern " + shown(pattern) +
                    " can match the empty string, which the tokenizers library splits on and "
                    "keel does not\nHINT: make every alternative match at least one character "
                    "(+ instead of *)");
  }
  // Without the JIT (an architecture PCRE2 has none for) the interpreter gives the same matches.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
}

HfRegex::~HfRegex() { pcre2_code_free(code_); }

void HfRegex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  // One JIT stack per thread: lookahead over a long whitespace run can outgrow the default 32 kB.
  struct Scratch {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    pcre2_match_data* data = pcre2_match_data_create(16, nullptr);
    Scratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
    ~Scratch() {
      pcre2_match_data_free(data);
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
    }
  };
  thread_local Scratch scratch;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const auto refuse = [&](const std::string& why) {
    throw DataError(where_ + ": the pattern " + why + " in a text of " +
                    std::to_string(text.size()) + " bytes");
  };
  const auto deadline = std::chrono::steady_clock::now() + kRegexBudget;
  size_t start = 0;
  for (int64_t calls = 1; start <= text.size(); ++calls) {
    if (calls % 256 == 0 && std::chrono::steady_clock::now() > deadline)
      refuse(fmt::format("took more than {} s (at byte {})", kRegexBudget.count(), start));
    // The subject ends kRegexWindow past `start` (on a character boundary), so that no call can
    // cost more than a window's worth (`b(?=b*c)` is quadratic in what it may look at). A match
    // attempt that reached the window's end (PCRE2_PARTIAL_HARD) is tried again from where it
    // began (none began and ended before it); one that began at `start` needs more than a window
    // to decide: refused, not guessed.
    size_t end = std::min(text.size(), start + kRegexWindow);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    const int rc = pcre2_match(code_, subject, end, start,
                               PCRE2_NO_UTF_CHECK | (end < text.size() ? PCRE2_PARTIAL_HARD : 0),
                               scratch.data, scratch.context);
    if (rc == PCRE2_ERROR_PARTIAL) {
      if (const size_t from = pcre2_get_ovector_pointer(scratch.data)[0]; from > start) {
        start = from;
        continue;
      }
      refuse(fmt::format("needs to look more than {} KiB ahead (at byte {})", kRegexWindow >> 10,
                         start));
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (end == text.size()) return;
      start = end;  // no match starts before the window's end
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      refuse(std::string("gave up (PCRE2: ") + reinterpret_cast<const char*>(message) + ")");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const size_t begin = ovector[0], stop = ovector[1];
    if (stop > begin) {
      out.emplace_back(begin, stop);
      start = stop;
    } else {  // an empty match yields nothing; go on from the next character
      if (begin >= text.size()) return;
      size_t len = 0;
      utf8_at(text, begin, &len);
      start = begin + len;
    }
  }
}

void split_pieces(const HfRegex& re, std::string_view text, SplitBehavior behavior, bool invert,
                  std::vector<std::string>& out) {
  std::vector<std::pair<size_t, size_t>> matches;
  re.find_all(text, matches);
  // (begin, end, is_match) over the whole text.
  std::vector<std::tuple<size_t, size_t, bool>> spans;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) spans.emplace_back(prev, b, invert);
    spans.emplace_back(b, e, !invert);
    prev = e;
  }
  if (prev < text.size()) spans.emplace_back(prev, text.size(), invert);
  std::vector<std::pair<size_t, size_t>> kept;
  bool previous_match = false;
  if (behavior == SplitBehavior::kMergedWithNext) {  // a match joins the piece after it
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      const auto& [b, e, is_match] = *it;
      if (is_match && !previous_match && !kept.empty())
        kept.back().first = b;
      else
        kept.emplace_back(b, e);
      previous_match = is_match;
    }
    std::reverse(kept.begin(), kept.end());
  }
  for (const auto& [b, e, is_match] : spans) {
    switch (behavior) {
      case SplitBehavior::kRemoved:
        if (!is_match) kept.emplace_back(b, e);
        break;
      case SplitBehavior::kIsolated:
        kept.emplace_back(b, e);
        break;
      case SplitBehavior::kContiguous:  // runs of matches, and of the rest, become one piece
        if (is_match == previous_match && !kept.empty())
          kept.back().second = e;
        else
          kept.emplace_back(b, e);
        break;
      case SplitBehavior::kMergedWithPrevious:  // a match joins the piece before it
        if (is_match && !previous_match && !kept.empty())
          kept.back().second = e;
        else
          kept.emplace_back(b, e);
        break;
      case SplitBehavior::kMergedWithNext:
        break;
    }
    previous_match = is_match;
  }
  for (const auto& [b, e] : kept)
    if (e > b) out.emplace_back(text.substr(b, e - b));
}

uint32_t utf8_at(std::string_view s, size_t i, size_t* len) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + i,
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  *len = n > 0 ? static_cast<size_t>(n) : 1;
  return n > 0 ? static_cast<uint32_t>(cp) : static_cast<unsigned char>(s[i]);
}

size_t utf8_before(std::string_view s, size_t i) {
  --i;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t n = 0;
    uint32_t min = 0;
    if (lead < 0x80) {
      out += static_cast<char>(lead);
      ++i;
      continue;
    }
    if (lead >= 0xC2 && lead <= 0xDF) {
      n = 2, min = 0x80;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      n = 3, min = 0x800;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      n = 4, min = 0x10000;
    }
    bool ok = n > 0 && i + n <= text.size();
    uint32_t cp = n == 2 ? lead & 0x1F : n == 3 ? lead & 0x0F : lead & 0x07;
    for (size_t k = 1; ok && k < n; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace keel::data
