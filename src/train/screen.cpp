#include "train/screen.h"

#include <xxhash.h>

#include <algorithm>

#include "common/quarantine_reason.h"

namespace keel::train {

void Screen::open(const config::StabilityConfig& cfg, const guard::Guard* guard,
                  monitor::JsonlFile& file, const data::BatchSource& data) {
  cfg_ = &cfg;
  guard_ = guard;
  data_ = &data;
  quarantine_ = Quarantine(file, data);
}

Screen::Bounds Screen::bounds(int64_t step) const {
  if (!guard_) return {};
  Bounds b;
  b.high = guard_->screen_threshold(step);
  if (b.high) b.low = guard_->low_threshold(step);
  return b;
}

std::vector<int64_t> Screen::fingerprints(const torch::Tensor& tokens) {
  const auto host = tokens.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t rows = host.size(0), row_bytes = host.size(1) * 8;
  const auto* bytes = static_cast<const char*>(host.data_ptr());
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b)
    out[b] = static_cast<int64_t>(XXH3_64bits(bytes + b * row_bytes, row_bytes));
  return out;
}

torch::Tensor Screen::keep_mask(const torch::Tensor& per_sample_loss,
                                const torch::Tensor& threshold, const torch::Tensor& low_keep) {
  torch::Tensor keep =
      per_sample_loss.le(threshold).logical_or(per_sample_loss.isnan()).to(torch::kFloat32);
  return low_keep.defined() ? keep * low_keep : keep;
}

bool Screen::masks_low_side(const Bounds& b) const {
  return b.high && cfg_ && cfg_->screen.low == config::LowScreen::kQuarantine;
}

torch::Tensor Screen::low_side_keep(const torch::Tensor& per_sample_loss, const data::Batch& batch,
                                    const std::vector<int64_t>& fingerprints,
                                    std::optional<double> low) const {
  const auto ids = batch.sample_ids.to(torch::kCPU, torch::kInt64).contiguous();
  std::vector<float> fresh(fingerprints.size(), 1.0f);
  for (size_t b = 0; b < fingerprints.size(); ++b)
    if (watch_.duplicate_of(static_cast<uint64_t>(fingerprints[b]), ids.data_ptr<int64_t>()[b]))
      fresh[b] = 0.0f;
  auto keep = torch::tensor(fresh, torch::kFloat32).to(per_sample_loss.device());
  if (low) keep = keep * per_sample_loss.ge(*low).logical_or(per_sample_loss.isnan());
  return keep;
}

void Screen::observe(const HostFigures& h, const Bounds& b, guard::StepSignals& s,
                     HostSamples& out) {
  const size_t n = h.ids.size();
  s.samples = static_cast<int64_t>(n);
  s.screen_threshold = b.high;
  s.low_threshold = b.low;
  out.ids = h.ids;
  out.losses = h.sample_losses;
  out.kept = h.kept;
  out.duplicate_of.assign(n, -1);
  out.low.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = h.ids[i];
    const auto hash = static_cast<uint64_t>(h.fingerprints[i]);
    if (auto first = watch_.duplicate_of(hash, id)) {
      out.duplicate_of[i] = *first;
      ++s.repeated;
    }
    watch_.remember({hash}, {id});  // one at a time: a repeat within the step too
    const double loss = out.losses[i];
    if (b.low && loss < *b.low) {
      out.low[i] = true;
      s.low_losses.push_back(loss);
    }
    // A masked sample below the high bound was masked for the low side (screen.low quarantine).
    if (out.kept[i])
      s.kept_losses.push_back(loss);
    else if (!(b.high && loss <= *b.high))
      s.masked_losses.push_back(loss);
    out.masked += !out.kept[i];
  }
}

void Screen::name_low_samples(const HostSamples& samples, guard::Decision& d) const {
  const bool wanted = std::any_of(d.events.begin(), d.events.end(),
                                  [](const auto& e) { return e.about_low_samples; });
  if (!wanted) return;
  // Repeats first, then low samples, lowest loss first; without either, the lowest-loss ones.
  std::vector<size_t> order(samples.ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto rank = [&](size_t i) {
    return samples.duplicate_of[i] >= 0 ? 0 : samples.low[i] ? 1 : 2;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return samples.losses[a] < samples.losses[b];
  });
  const bool any_flagged = !order.empty() && rank(order.front()) < 2;
  const auto top_k = std::max<int64_t>(cfg_ ? cfg_->top_k_samples : 1, 1);
  nlohmann::json named = nlohmann::json::array();
  for (size_t i : order) {
    if (static_cast<int64_t>(named.size()) >= top_k || (any_flagged && rank(i) == 2)) break;
    nlohmann::json sample = {{"id", samples.ids[i]}, {"loss", samples.losses[i]}};
    if (auto where = data_->locate(samples.ids[i]); !where.empty()) sample["where"] = where;
    if (const int64_t first = samples.duplicate_of[i]; first >= 0) {
      sample["duplicate_of"] = first;
      if (auto where = data_->locate(first); !where.empty()) sample["duplicate_where"] = where;
    }
    named.push_back(std::move(sample));
  }
  for (auto& e : d.events)
    if (e.about_low_samples) e.name_samples(named);
}

void Screen::quarantine_masked(const HostSamples& samples, const TrainCounters& at,
                               guard::Decision& d) {
  if (samples.masked == 0) return;
  const bool low_masking = cfg_->screen.low == config::LowScreen::kQuarantine;
  std::vector<std::pair<double, int64_t>> masked;  // (loss, id)
  for (size_t i = 0; i < samples.ids.size(); ++i) {
    if (samples.kept[i]) continue;
    if (!low_masking || !samples.low_side(i)) {
      masked.emplace_back(samples.losses[i], samples.ids[i]);
    } else if (samples.duplicate_of[i] >= 0) {
      quarantine_.record(samples.ids[i], at, name_of(QuarantineReason::kRepeatedData),
                         samples.losses[i], {{"duplicate_of", samples.duplicate_of[i]}});
    } else {
      quarantine_.record(samples.ids[i], at, name_of(QuarantineReason::kLowLoss),
                         samples.losses[i]);
    }
  }
  if (masked.empty()) return;
  const nlohmann::json named =
      quarantine_.record_screened(std::move(masked), at, cfg_->top_k_samples);
  for (auto& e : d.events)
    if (e.about_screened_samples) e.name_samples(named);
}

}  // namespace keel::train
