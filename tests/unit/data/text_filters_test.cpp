// The repetition filter's measures on texts whose answer is known by construction.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "data/text_filters.h"
#include "data_test_util.h"

namespace keel::data {
namespace {

TEST(RepeatedShare, CountsTheBytesOfSpansSeenBeforeInTheSameText) {
  EXPECT_EQ(repeated_share(""), 0.0);
  EXPECT_EQ(repeated_share(std::string(2 * kRepeatSpan - 1, '=')), 0.0);  // too short to judge
  // One character over and over: every window after the first repeats it, so all bytes but the
  // first are covered.
  EXPECT_DOUBLE_EQ(repeated_share(std::string(400, '=')), 399.0 / 400.0);
  // A 100-byte block pasted three times: the second and third copies repeat the first.
  std::mt19937_64 rng(3);
  std::string block;
  for (int i = 0; i < 100; ++i) block += static_cast<char>('a' + rng() % 26);
  EXPECT_NEAR(repeated_share(block + block + block), 200.0 / 300.0, 1e-12);
  // Ordinary prose repeats words and short phrases, not 32-byte spans.
  EXPECT_EQ(repeated_share(testing::join(testing::random_words(rng, 300))), 0.0);
}

TEST(TopCharShare, CountsCharactersNotBytesAndIgnoresWhitespace) {
  EXPECT_EQ(top_char_share(std::string(kTopCharMinChars - 1, '#')), 0.0);  // too short to judge
  EXPECT_DOUBLE_EQ(top_char_share(std::string(40, '#') + "\n\n    " + std::string(40, 'x')), 0.5);
  // "é" is two bytes: 40 of them and 40 'a' are half each, whatever the byte count says.
  std::string accented;
  for (int i = 0; i < 40; ++i) accented += "\xc3\xa9 a";
  EXPECT_DOUBLE_EQ(top_char_share(accented), 0.5);
  // Chinese text shares lead bytes between characters; characters are what is counted.
  std::string chinese;
  for (const char* c : {"\xe4\xb8\x80", "\xe4\xb8\x81", "\xe4\xb8\x82", "\xe4\xb8\x83"})
    for (int i = 0; i < 10; ++i) chinese += c;
  EXPECT_DOUBLE_EQ(top_char_share(chinese), 0.25);
}

TEST(RepetitionVerdict, NamesTheRuleAndZeroTurnsARuleOff) {
  RepetitionRules rules{.max_repeated_share = 0.4, .max_top_char_share = 0.5};
  EXPECT_EQ(repetition_verdict(rules, std::string(300, '~')), "one_character");
  std::string tag = "<li><a href=\"/about\">About</a></li><li><a href=\"/contact\">Contact</a>";
  EXPECT_EQ(repetition_verdict(rules, tag + " id=1 " + tag + " id=2 " + tag), "repeated_spans");
  std::mt19937_64 rng(5);
  EXPECT_EQ(repetition_verdict(rules, testing::join(testing::random_words(rng, 200))), "");
  EXPECT_EQ(repetition_verdict({}, std::string(300, '~')), "");
}

}  // namespace
}  // namespace keel::data
