// spaCy's English word splitting of datatrove-simplified text (data/spacy_en_words.h) against the
// words spaCy 3.8.18 gave (datatrove's load_word_tokenizer("en").word_tokenize, in the bench venv
// of bench/data/datatrove_minhash.py). Fuzzed texts of symbols, units and exceptions
// (bench/data/spacy_words/parity.py) and the bench's man pages are compared there.
#include "data/spacy_en_words.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel::data {
namespace {

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string_view> views;
  spacy_en_words(text, views);
  return {views.begin(), views.end()};
}

using Words = std::vector<std::string>;

TEST(SpacyEnWords, ExceptionsAndUnitsSplitAsSpacySplitsThem) {
  EXPECT_EQ(words("i dont know why you cannot see 0m of 0gb im sure wed go"),
            (Words{"i", "do", "nt", "know", "why", "you", "can",  "not", "see", "0",
                   "m", "of", "0",  "gb",   "i",   "m",   "sure", "we",  "d",   "go"}));
  EXPECT_EQ(words("gonna lets itd yall"), (Words{"gon", "na", "lets", "it", "d", "y", "all"}));
}

TEST(SpacyEnWords, SymbolsArePrefixesSuffixesAndInfixes) {
  EXPECT_EQ(words("0km 0° 0%  €0 £ x©y ¡hola¿ ♥love"),
            (Words{"0", "km", "0", "°", "0", "%", "€", "0", "£", "x", "©", "y", "¡", "hola", "¿",
                   "♥", "love"}));
  EXPECT_EQ(words("﹃‘s ‘s x‘s"), (Words{"﹃‘s", "‘s", "x‘s"}));
}

// A special case its own affix rules would split ("‘s" is "‘" and "s") is found again among the
// words of the whole text, and joined, when nothing but the split parted it.
TEST(SpacyEnWords, ASpecialCaseSplitByAffixesIsJoinedAgain) {
  EXPECT_EQ(words("x 🤨‘s⏼ y"), (Words{"x", "🤨", "‘s", "⏼", "y"}));
  EXPECT_EQ(words("‘ s"), (Words{"‘", "s"}));
}

TEST(SpacyEnWords, SpacesSeparateAndBytesThatAreNotUtf8AreOneWord) {
  EXPECT_EQ(words("  a  b "), (Words{"a", "b"}));
  EXPECT_TRUE(words("").empty());
  EXPECT_EQ(words("x\xff©y z"), (Words{"x\xff©y", "z"}));
}

}  // namespace
}  // namespace keel::data
