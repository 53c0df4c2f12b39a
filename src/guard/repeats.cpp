#include "guard/repeats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace keel::guard {
namespace {

// 1.4826 x MAD estimates the standard deviation of normal data.
constexpr double kMadToSigma = 1.4826;

double median_of(std::vector<double> v) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace

std::optional<int64_t> RepeatWatch::duplicate_of(uint64_t hash, int64_t id) const {
  const auto it = seen_.find(hash);
  if (it == seen_.end() || it->second.first_id == id) return std::nullopt;
  return it->second.first_id;
}

void RepeatWatch::remember(const std::vector<uint64_t>& hashes, const std::vector<int64_t>& ids) {
  if (hashes.size() != ids.size())
    throw std::invalid_argument("RepeatWatch::remember: one id per hash");
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto [it, fresh] = seen_.try_emplace(hashes[i], Seen{ids[i], 0});
    ++it->second.count;
    order_.emplace_back(hashes[i], ids[i]);
  }
  while (static_cast<int64_t>(order_.size()) > capacity_) {
    const auto it = seen_.find(order_.front().first);
    if (it != seen_.end() && --it->second.count == 0) seen_.erase(it);
    order_.pop_front();
  }
}

std::vector<int64_t> RepeatWatch::state() const {
  std::vector<int64_t> flat;
  flat.reserve(order_.size() * 2);
  for (const auto& [hash, id] : order_) {
    flat.push_back(static_cast<int64_t>(hash));
    flat.push_back(id);
  }
  return flat;
}

void RepeatWatch::load_state(const std::vector<int64_t>& flat) {
  if (flat.size() % 2 != 0)
    throw std::invalid_argument("RepeatWatch::load_state: (hash, id) pairs");
  order_.clear();
  seen_.clear();
  std::vector<uint64_t> hashes;
  std::vector<int64_t> ids;
  for (size_t i = 0; i < flat.size(); i += 2) {
    hashes.push_back(static_cast<uint64_t>(flat[i]));
    ids.push_back(flat[i + 1]);
  }
  remember(hashes, ids);
}

void LossPeriodicity::push(double loss) {
  if (!std::isfinite(loss)) return;
  losses_.push_back(loss);
  while (static_cast<int64_t>(losses_.size()) > kPeriodWindow) losses_.pop_front();
}

void LossPeriodicity::load_state(const nlohmann::json& state) {
  losses_.clear();
  for (const auto& v : state) losses_.push_back(v.get<double>());
}

std::optional<LossPeriodicity::Finding> LossPeriodicity::detect() const {
  if (static_cast<int64_t>(losses_.size()) < kPeriodWindow) return std::nullopt;
  // Residuals against a trailing median: the trend of a falling loss goes, a one-step dip stays.
  std::vector<double> r;
  for (size_t i = kPeriodMedian - 1; i < losses_.size(); ++i)
    r.push_back(losses_[i] -
                median_of({losses_.begin() + static_cast<std::ptrdiff_t>(i + 1 - kPeriodMedian),
                           losses_.begin() + static_cast<std::ptrdiff_t>(i + 1)}));
  const auto n = static_cast<int64_t>(r.size());
  const double center = median_of(r);
  std::vector<double> deviation;
  for (double v : r) deviation.push_back(std::abs(v - center));
  const double sigma = kMadToSigma * median_of(deviation);
  if (!(sigma > 0)) return std::nullopt;
  const auto is_dip = [&](int64_t i) { return i >= 0 && r[i] < center - kDipSigmas * sigma; };
  if (!is_dip(n - 1)) return std::nullopt;

  double mean = 0.0, var = 0.0;
  for (double v : r) mean += v;
  mean /= static_cast<double>(n);
  for (double v : r) var += (v - mean) * (v - mean);
  if (!(var > 0)) return std::nullopt;
  std::vector<Finding> found;
  double strongest = 0.0;
  for (int64_t k = kMinPeriod; k <= n / 3; ++k) {
    double c = 0.0;
    for (int64_t i = k; i < n; ++i) c += (r[i] - mean) * (r[i - k] - mean);
    const double rho = c / var;
    if (rho >= kPeriodCorrelation && is_dip(n - 1 - k) && is_dip(n - 1 - 2 * k)) {
      found.push_back({k, rho, (r[n - 1] - center) / sigma});
      strongest = std::max(strongest, rho);
    }
  }
  // A period's multiples correlate as well: the shortest one nearly as strong is the period.
  for (const Finding& f : found)
    if (f.correlation >= 0.9 * strongest) return f;
  return std::nullopt;
}

}  // namespace keel::guard
