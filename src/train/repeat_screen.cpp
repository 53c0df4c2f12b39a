// The screen's low side, the seed's §3.2 repeated data: content fingerprints of every sample for
// the repeat watch (guard/repeats.h), the mask under stability.screen.low quarantine, and the
// samples named in the guard's warnings about repeated data.
#include <xxhash.h>

#include <algorithm>

#include "train/trainer_state.h"

namespace keel::train {

std::vector<int64_t> sample_fingerprints(const torch::Tensor& tokens) {
  const auto host = tokens.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t rows = host.size(0), row_bytes = host.size(1) * 8;
  const auto* bytes = static_cast<const char*>(host.data_ptr());
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b)
    out[b] = static_cast<int64_t>(XXH3_64bits(bytes + b * row_bytes, row_bytes));
  return out;
}

torch::Tensor Trainer::State::low_side_keep(const torch::Tensor& per_sample_loss,
                                            const data::Batch& batch,
                                            const std::vector<int64_t>& fingerprints,
                                            std::optional<double> low) const {
  const auto ids = batch.sample_ids.to(torch::kCPU, torch::kInt64).contiguous();
  std::vector<float> fresh(fingerprints.size(), 1.0f);
  for (size_t b = 0; b < fingerprints.size(); ++b)
    if (repeat_watch.duplicate_of(static_cast<uint64_t>(fingerprints[b]),
                                  ids.data_ptr<int64_t>()[b]))
      fresh[b] = 0.0f;
  auto keep = torch::tensor(fresh, torch::kFloat32).to(per_sample_loss.device());
  if (low) keep = keep * per_sample_loss.ge(*low).logical_or(per_sample_loss.isnan());
  return keep;
}

void Trainer::State::observe_repeats(guard::StepSignals& s, const HostFigures& h,
                                     const StepResult& r, HostSamples& host_samples) {
  const size_t n = h.ids.size();  // every rank's, in rank order
  s.low_threshold = r.low_threshold;
  host_samples.duplicate_of.assign(n, -1);
  host_samples.low.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = h.ids[i];
    const auto hash = static_cast<uint64_t>(h.fingerprints[i]);
    if (auto first = repeat_watch.duplicate_of(hash, id)) {
      host_samples.duplicate_of[i] = *first;
      ++s.repeated;
    }
    repeat_watch.remember({hash}, {id});  // one at a time: a repeat within the step too
    const double loss = host_samples.losses[i];
    if (r.low_threshold && loss < *r.low_threshold) {
      host_samples.low[i] = true;
      s.low_losses.push_back(loss);
    }
  }
}

void Trainer::State::name_low_samples(const HostSamples& host_samples, guard::Decision& d) const {
  const bool wanted = std::any_of(d.events.begin(), d.events.end(),
                                  [](const auto& e) { return e.about_low_samples; });
  if (!wanted) return;
  // Repeats first, then low samples, lowest loss first; without either, the lowest-loss ones.
  std::vector<size_t> order(host_samples.ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto rank = [&](size_t i) {
    return host_samples.duplicate_of[i] >= 0 ? 0 : host_samples.low[i] ? 1 : 2;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return host_samples.losses[a] < host_samples.losses[b];
  });
  const bool any_flagged = !order.empty() && rank(order.front()) < 2;
  nlohmann::json named = nlohmann::json::array();
  for (size_t i : order) {
    if (static_cast<int64_t>(named.size()) >= std::max<int64_t>(cfg.stability.top_k_samples, 1) ||
        (any_flagged && rank(i) == 2))
      break;
    nlohmann::json sample = {{"id", host_samples.ids[i]}, {"loss", host_samples.losses[i]}};
    if (auto where = train_data->locate(host_samples.ids[i]); !where.empty())
      sample["where"] = where;
    if (const int64_t first = host_samples.duplicate_of[i]; first >= 0) {
      sample["duplicate_of"] = first;
      if (auto where = train_data->locate(first); !where.empty()) sample["duplicate_where"] = where;
    }
    named.push_back(std::move(sample));
  }
  for (auto& e : d.events)
    if (e.about_low_samples) e.name_samples(named);
}

}  // namespace keel::train
