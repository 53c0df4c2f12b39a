#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "monitor/device_window.h"
#include "monitor/json_record.h"
#include "monitor/progress.h"

namespace keel::monitor {
namespace {

TEST(JsonRecord, DoublesReadBackBitForBit) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(-20, 20);
  for (int i = 0; i < 2000; ++i) {
    double v = std::exp(u(rng)) * (i % 2 ? 1 : -1);
    auto parsed = nlohmann::json::parse(JsonRecord().add("v", v).str());
    EXPECT_EQ(std::bit_cast<uint64_t>(parsed["v"].get<double>()), std::bit_cast<uint64_t>(v)) << v;
  }
}

TEST(JsonRecord, ShortestFormAndTypes) {
  auto s = JsonRecord()
               .add("a", 0.1)
               .add("b", 2.0)
               .add("n", int64_t{7})
               .add("t", true)
               .add("s", "x\"y")
               .str();
  EXPECT_EQ(s, R"({"a":0.1,"b":2.0,"n":7,"t":true,"s":"x\"y"})");
  EXPECT_EQ(format_double(std::numeric_limits<double>::quiet_NaN()), "null");
  EXPECT_EQ(format_double(1e300 * 1e300), "null");
  EXPECT_EQ(format_double(3e-4), "3e-04");  // shortest form, valid JSON
}

TEST(DeviceWindow, MedianOverTheLastNValues) {
  DeviceWindow w(5, torch::kCPU);
  EXPECT_TRUE(std::isnan(w.median()));
  for (double v : {9.0, 1.0, 5.0}) w.push(torch::tensor(v));
  EXPECT_EQ(w.size(), 3);
  EXPECT_DOUBLE_EQ(w.median(), 5.0);
  for (double v : {2.0, 3.0, 4.0, 100.0}) w.push(torch::tensor(v));  // 9 and 1 fall out
  EXPECT_EQ(w.size(), 5);
  EXPECT_DOUBLE_EQ(w.median(), 4.0);
  auto values = w.values();
  EXPECT_EQ(values[0].item<double>(), 5.0);  // oldest first
  EXPECT_EQ(values[4].item<double>(), 100.0);
}

TEST(Progress, FormatsDurationsAndCounts) {
  EXPECT_EQ(format_duration(12.4), "12s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(4.56e6), "4.56M");
  EXPECT_EQ(format_count(7.891e9), "7.89G");
}

}  // namespace
}  // namespace keel::monitor
