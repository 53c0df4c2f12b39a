#include "guard/running_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace keel::guard {

void RunningWindow::push(double value) {
  values_.push_back(value);
  while (static_cast<int64_t>(values_.size()) > capacity_) values_.pop_front();
}

double RunningWindow::median() const {
  if (values_.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v(values_.begin(), values_.end());
  auto mid = v.begin() + v.size() / 2;
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double RunningWindow::mad() const {
  if (values_.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double m = median();
  std::vector<double> v;
  v.reserve(values_.size());
  for (double x : values_) v.push_back(std::fabs(x - m));
  auto mid = v.begin() + v.size() / 2;
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double RunningWindow::median_of_last(int64_t n) const {
  if (values_.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto count = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(n, 1)), values_.size());
  std::vector<double> v(values_.end() - static_cast<std::ptrdiff_t>(count), values_.end());
  auto mid = v.begin() + v.size() / 2;
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double RunningWindow::difference_sigma() const {
  if (values_.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> d;
  d.reserve(values_.size() - 1);
  for (size_t i = 1; i < values_.size(); ++i) d.push_back(std::fabs(values_[i] - values_[i - 1]));
  auto mid = d.begin() + d.size() / 2;
  std::nth_element(d.begin(), mid, d.end());
  return 1.4826 * *mid / std::sqrt(2.0);
}

double RunningWindow::sum() const { return std::accumulate(values_.begin(), values_.end(), 0.0); }

double RunningWindow::mean() const {
  if (values_.empty()) return std::numeric_limits<double>::quiet_NaN();
  return sum() / static_cast<double>(values_.size());
}

double RunningWindow::stddev() const {
  if (values_.empty()) return std::numeric_limits<double>::quiet_NaN();
  double m = mean(), acc = 0.0;
  for (double v : values_) acc += (v - m) * (v - m);
  return std::sqrt(acc / static_cast<double>(values_.size()));
}

double RunningWindow::slope() const {
  const auto n = static_cast<double>(values_.size());
  if (values_.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double x_mean = (n - 1.0) / 2.0, y_mean = mean();
  double sxy = 0.0, sxx = 0.0;
  for (size_t i = 0; i < values_.size(); ++i) {
    const double dx = static_cast<double>(i) - x_mean;
    sxy += dx * (values_[i] - y_mean);
    sxx += dx * dx;
  }
  return sxy / sxx;
}

nlohmann::json RunningWindow::state() const {
  return {{"capacity", capacity_}, {"values", std::vector<double>(values_.begin(), values_.end())}};
}

void RunningWindow::load_state(const nlohmann::json& state) {
  values_.clear();
  for (double v : state.at("values").get<std::vector<double>>()) push(v);
}

void TailRate::push(double count, double samples, bool learn) {
  recent_.push_back({count, samples, learn});
  retire_beyond_window();
}

// The steps past the newest window (one per push; several after a load into a shorter window)
// teach the rate when they may.
void TailRate::retire_beyond_window() {
  while (static_cast<int64_t>(recent_.size()) > window_) {
    const Step oldest = recent_.front();
    recent_.pop_front();
    if (!oldest.learn) continue;
    counts_.push(oldest.count);
    samples_.push(oldest.samples);
  }
}

double TailRate::recent_count() const {
  double sum = 0.0;
  for (const Step& s : recent_) sum += s.count;
  return sum;
}

double TailRate::recent_samples() const {
  double sum = 0.0;
  for (const Step& s : recent_) sum += s.samples;
  return sum;
}

int64_t TailRate::allowance(int64_t floor) const {
  if (!learned()) return floor;
  constexpr double kZ = 4.0;
  const double lambda = rate() * recent_samples();
  return std::max(floor, static_cast<int64_t>(lambda + kZ * std::sqrt(lambda) + kZ));
}

nlohmann::json TailRate::state() const {
  nlohmann::json recent = nlohmann::json::array();
  for (const Step& s : recent_) recent.push_back({s.count, s.samples, s.learn});
  return {{"recent", recent}, {"counts", counts_.state()}, {"samples", samples_.state()}};
}

void TailRate::load_state(const nlohmann::json& state) {
  recent_.clear();
  for (const auto& s : state.at("recent"))
    recent_.push_back({s.at(0).get<double>(), s.at(1).get<double>(), s.at(2).get<bool>()});
  counts_.load_state(state.at("counts"));
  samples_.load_state(state.at("samples"));
  retire_beyond_window();  // a resume with a shorter median_window
}

}  // namespace keel::guard
