#include "data/hf_regex.h"

#include <gtest/gtest.h>

#include <chrono>

#include "common/error.h"

namespace keel::data {
namespace {

std::vector<std::string> split(const std::string& pattern, const std::string& text,
                               SplitBehavior behavior, bool invert = false) {
  HfRegex re(pattern, "test");
  std::vector<std::string> out;
  split_pieces(re, text, behavior, invert, out);
  return out;
}

using Pieces = std::vector<std::string>;

// tokenizers' own documentation of SplitDelimiterBehavior, "the-final--countdown" split on "-".
TEST(HfRegex, SplitBehaviorsAsTokenizersDocumentsThem) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(split("-", text, SplitBehavior::kRemoved), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(split("-", text, SplitBehavior::kIsolated),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("-", text, SplitBehavior::kMergedWithPrevious),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("-", text, SplitBehavior::kMergedWithNext),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("-", text, SplitBehavior::kContiguous),
            (Pieces{"the", "-", "final", "--", "countdown"}));
  // invert: the pattern names the pieces to keep.
  EXPECT_EQ(split("[a-z]+", text, SplitBehavior::kRemoved, /*invert=*/true),
            (Pieces{"the", "final", "countdown"}));
}

// Oniguruma's \s holds U+0085 (NEL), PCRE2's does not: keel's regexes hold it, in and out of a
// class; and $ is a line anchor.
TEST(HfRegex, WhitespaceAndAnchorsAreOniguruma) {
  EXPECT_EQ(split("\\s+",
                  "a\xC2\x85"
                  "b",
                  SplitBehavior::kIsolated),
            (Pieces{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(split("[^\\s]+",
                  "a\xC2\x85"
                  "b",
                  SplitBehavior::kRemoved, true),
            (Pieces{"a", "b"}));
  EXPECT_EQ(split("\\S+", "x\xC2\x85y", SplitBehavior::kRemoved, true), (Pieces{"x", "y"}));
  EXPECT_EQ(split("[ ]+$", "a  \nb", SplitBehavior::kIsolated), (Pieces{"a", "  ", "\nb"}));
  // Unicode classes and lookahead: GPT-2's pattern on mixed scripts.
  const std::string gpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(split(gpt2, "it's  Кириллица 42!", SplitBehavior::kIsolated),
            (Pieces{"it", "'s", " ", " Кириллица", " 42", "!"}));
}

TEST(HfRegex, APatternPcre2RefusesNamesWhereItCameFrom) {
  try {
    HfRegex re("(unclosed", "tokenizer.json: pre_tokenizer Split");
    FAIL() << "compiled";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: pre_tokenizer Split: the pattern "
                                         "(unclosed cannot be compiled"),
              std::string::npos)
        << e.what();
  }
}

// Issue 49: a pattern that can match the empty string splits differently in tokenizers (it splits
// at every empty match) and is refused; a long pattern of a hostile file is named by its start.
TEST(HfRegex, APatternThatCanMatchNothingIsRefusedAndALongOneIsShownShort) {
  for (const char* empty : {"x*", "a|", "(?=b)", "\\s*$"}) {
    try {
      HfRegex re(empty, "tok.json: pre_tokenizer Split");
      FAIL() << empty << " compiled";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("can match the empty string"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(HfRegex("x+|\\s+(?!\\S)", "t"));
  try {
    HfRegex re(std::string(140000, '('), "tok.json: pre_tokenizer Split");
    FAIL() << "compiled";
  } catch (const DataError& e) {
    EXPECT_LT(std::string(e.what()).size(), 600u);
    EXPECT_NE(std::string(e.what()).find("(140000 bytes)"), std::string::npos);
  }
}

// Issue 49: matching reads a window of 64 KiB past where it stands, so no call costs more than a
// window's worth: a long text gives the pieces one call over the whole text gives (words cut by
// the window's end are tried again from where they began), and a pattern that must look further
// than the window (b(?=b*c) over a megabyte: quadratic, it ran past a minute) is refused at once,
// naming where the pattern came from.
TEST(HfRegex, MatchingLooksAWindowAheadAndRefusesWhatNeedsMore) {
  std::string text;
  size_t written = 0;
  for (; text.size() < 300000; ++written)
    text += "word" + std::to_string(written) + " \xC3\xA9t\xC3\xA9 ";
  const auto pieces = split("\\p{L}+|\\p{N}+|\\s+(?!\\S)|\\s+", text, SplitBehavior::kIsolated);
  std::string joined;
  size_t words = 0;
  for (const auto& p : pieces) {
    joined += p;
    words += p.rfind("word", 0) == 0;
    EXPECT_LE(p.size(), 8u) << "a piece cut at a window's end";
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(words, written);
  const auto start = std::chrono::steady_clock::now();
  try {
    split("b(?=b*c)", std::string(1 << 20, 'b') + "c", SplitBehavior::kIsolated);
    FAIL() << "matched";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("test: the pattern needs to look more than 64 KiB ahead"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(HfRegex, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(valid_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(valid_utf8("a\xFF"
                       "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(valid_utf8("end\xE2\x82"), "end\xEF\xBF\xBD\xEF\xBF\xBD");            // truncated
  EXPECT_EQ(regex_escape("a.b*(c)"), "a\\.b\\*\\(c\\)");
}

}  // namespace
}  // namespace keel::data
