// The command line's numbers (cli/number_options.h): sizes as people type them, and messages that
// name the unit and the range.
#include "cli/number_options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace keel::cli {
namespace {

double size_of(const std::string& text) {
  double bytes = -1;
  std::string error;
  EXPECT_TRUE(parse_byte_size(text, bytes, error)) << text << ": " << error;
  return bytes;
}

TEST(ByteSize, TakesBytesAndTheUnitsPeopleType) {
  EXPECT_EQ(size_of("80e9"), 80e9);
  EXPECT_EQ(size_of("80GB"), 80e9);
  EXPECT_EQ(size_of("80 gb"), 80e9);
  EXPECT_EQ(size_of("80G"), 80e9);
  EXPECT_EQ(size_of("5GiB"), 5.0 * (1 << 30));
  EXPECT_EQ(size_of("74.5GiB"), 74.5 * (1 << 30));
  EXPECT_EQ(size_of("512MiB"), 512.0 * (1 << 20));
  EXPECT_EQ(size_of("1024"), 1024.0);
}

TEST(ByteSize, RefusesWithTheUnitsItTakes) {
  for (const char* bad : {"abc", "80 bananas", "0", "-5GB", "GB", ""}) {
    double bytes = 0;
    std::string error;
    EXPECT_FALSE(parse_byte_size(bad, bytes, error)) << bad;
    EXPECT_LT(error.size(), 300u) << error;
    EXPECT_NE(error.find(bad), std::string::npos) << error;
  }
  double bytes = 0;
  std::string error;
  parse_byte_size("80 bananas", bytes, error);
  EXPECT_NE(error.find("GiB"), std::string::npos) << error;
}

TEST(NumberOptions, MessagesNameTheUnitAndTheRange) {
  CLI::App app;
  long steps = 0, threads = 0;
  double seconds = 0, memory = 0;
  app.add_option("--profile", steps)->check(whole_at_least(1, "steps"));
  app.add_option("--jobs", threads)->check(whole_at_least(0, "threads"));
  app.add_option("--step-time", seconds)->check(positive("seconds"));
  app.add_option("--device-memory", memory)->transform(byte_size());
  const auto error_of = [&](std::vector<std::string> args) -> std::string {
    std::reverse(args.begin(), args.end());
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of({"--device-memory", "5GiB", "--jobs", "0"}), "");
  EXPECT_EQ(memory, 5.0 * (1 << 30));
  const std::string profile = error_of({"--profile", "0"});
  EXPECT_NE(profile.find("whole number of steps, 1 or more"), std::string::npos) << profile;
  EXPECT_NE(error_of({"--jobs", "-1"}).find("threads, 0 or more"), std::string::npos);
  EXPECT_NE(error_of({"--step-time", "0"}).find("seconds above 0"), std::string::npos);
  const std::string size = error_of({"--device-memory", "80 bananas"});
  EXPECT_NE(size.find("--device-memory"), std::string::npos) << size;
  EXPECT_LT(size.size(), 300u) << size;
}

}  // namespace
}  // namespace keel::cli
