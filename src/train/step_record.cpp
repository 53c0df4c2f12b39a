// The record of applied steps: one metrics line (and the progress line) per logging window, with
// the seed's data statistics, and the consumed-vs-steps cross-check that runs with it.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "common/error.h"
#include "train/trainer_state.h"

namespace keel::train {

namespace {

// The q-quantile (nearest rank) of `v`, which it reorders.
double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto k = static_cast<size_t>(
      std::min<double>(q * static_cast<double>(v.size()), static_cast<double>(v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

// The seed's continuous data statistics for the step just applied: its per-sample loss
// distribution, the lengths of the documents its windows start in, and its bucket (cluster) mix.
nlohmann::json Trainer::State::data_statistics() const {
  nlohmann::json out = nlohmann::json::object();
  std::vector<double> losses;
  for (size_t i = 0; i < host_samples.losses.size(); ++i)
    if (host_samples.kept[i] && std::isfinite(host_samples.losses[i]))
      losses.push_back(host_samples.losses[i]);
  if (!losses.empty()) {
    const double mean = std::accumulate(losses.begin(), losses.end(), 0.0) / losses.size();
    const double max = *std::max_element(losses.begin(), losses.end());
    out["sample_loss"] = {{"mean", mean},
                          {"p50", quantile(losses, 0.5)},
                          {"p99", quantile(losses, 0.99)},
                          {"max", max}};
  }
  if (!step_samples.doc_lengths.empty()) {
    const auto lengths = torch::cat(step_samples.doc_lengths).to(torch::kFloat64).contiguous();
    std::vector<double> v(lengths.data_ptr<double>(), lengths.data_ptr<double>() + lengths.numel());
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / std::max<size_t>(v.size(), 1);
    out["doc_len"] = {{"mean", mean}, {"p95", quantile(v, 0.95)}};
  }
  if (!step_samples.buckets.empty()) {
    const auto buckets = torch::cat(step_samples.buckets).contiguous();
    std::map<int64_t, int64_t> mix;
    for (int64_t i = 0; i < buckets.numel(); ++i) ++mix[buckets.data_ptr<int64_t>()[i]];
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [bucket, count] : mix) j[std::to_string(bucket)] = count;
    out["bucket_mix"] = j;
  }
  return out;
}

// One metrics line (and the progress line) for the logging window that ends with this step.
// `update_ratios` is {total, per layer...} from apply_update.
void Trainer::State::record_step(const StepResult& r, double lr,
                                 const std::vector<double>& update_ratios) {
  last_loss = r.loss.item<double>();
  const double norm = r.grad_norm.item<double>();
  const double elapsed = seconds_since(window.start);
  const int64_t steps = std::max<int64_t>(window.steps, 1);
  const double tokens_per_s = window.steps * tokens_per_step / std::max(elapsed, 1e-9);
  const double step_ms = elapsed * 1e3 / steps;
  const std::vector<double> layer_ratios(update_ratios.begin() + 1, update_ratios.end());
  data::LoaderStats loader = train_data->take_stats();
  // The guard's periodic signals (update ratios, attention drift) count toward its time too.
  std::vector<guard::GuardEvent> periodic;
  if (guard) {
    const auto start = Clock::now();
    periodic = guard->observe_periodic(counters.step, layer_ratios, model->attention_output_std());
    window.guard_s += seconds_since(start);
  }
  if (loader.waits > 0)
    event(EventKind::kLoaderWait, {{"wait_ms", loader.wait_ms}, {"waits", loader.waits}});

  monitor::JsonRecord rec;
  rec.add("step", counters.step)
      .add("loss", last_loss)
      .add("lr", lr)
      .add("grad_norm", norm)
      .add("grad_norm_median", guard ? guard->grad_norm_median() : grad_norm_window->median())
      .add("clipped", norm > r.clip_bound)
      .add("clip_bound", r.clip_bound)
      .add("update_ratio", update_ratios.front())
      .add("tokens_per_s", tokens_per_s)
      .add("step_ms", step_ms)
      .add("loader_wait_ms", window.loader_wait_s * 1e3 / steps)
      .add("guard_ms", window.guard_s * 1e3 / steps)
      .add("queue_depth", loader.queue_depth);
  if (guard) rec.add("clip_rate", static_cast<double>(window.clipped) / steps);
  if (scaler) rec.add("loss_scale", scaler->scale().item<double>());
  if (comm.is_process_group()) rec.add("comm_ms", window.comm_s * 1e3 / steps);
  const int64_t samples = counters.samples_seen(cfg.data.micro_batch_size, comm.world_size());
  rec.add("tokens_seen", samples * cfg.model.seq_len).add("samples_seen", samples);
  if (guard) {
    nlohmann::json per_layer = nlohmann::json::object(), layer_norms = nlohmann::json::object();
    for (size_t i = 0; i < layer_ratios.size(); ++i)
      per_layer[layers->names()[i]] = layer_ratios[i];
    for (size_t i = 0; i < last_layer_grad_norms.size() && i < layers->names().size(); ++i)
      layer_norms[layers->names()[i]] = last_layer_grad_norms[i];
    rec.add("update_ratio_layers", per_layer).add("grad_norm_layers", layer_norms);
    rec.add("skipped_steps", window.skipped).add("masked_samples", window.masked);
    if (r.screen_threshold) rec.add("screen_threshold", *r.screen_threshold);
    const nlohmann::json statistics = data_statistics();
    for (auto& [key, value] : statistics.items()) rec.add(key, value);
    if (guard->in_recovery(counters.step)) rec.add("recovery", true);
  }
  files.write_metrics(counters.step, rec);
  for (auto& e : periodic) event(e.kind, e.detail);

  monitor::ProgressSample ps;
  ps.step = counters.step;
  ps.max_steps = cfg.run.max_steps;
  ps.loss = last_loss;
  ps.lr = lr;
  ps.grad_norm = norm;
  ps.tokens_per_s = tokens_per_s;
  ps.step_ms = step_ms;
  ps.loss_floor = loss_floor.value_or(-1.0);
  ps.tokens_seen = samples * cfg.model.seq_len;
  progress->update(ps);
  window.reset();
}

// The samples the loader took from the data order must match what the trainer asked for: a
// silent loss or repeat of data would otherwise go unnoticed for days.
void Trainer::State::check_consumed() {
  auto counts =
      torch::tensor({static_cast<double>(train_data->samples_served()),
                     static_cast<double>(counters.micro_taken * cfg.data.micro_batch_size)},
                    torch::kFloat64);
  std::vector<torch::Tensor> t{counts.to(device)};
  comm.all_reduce_sum_(t);
  auto host = t[0].to(torch::kCPU);
  const double served = host[0].item<double>(), expected = host[1].item<double>();
  const double deviation = expected > 0 ? std::abs(served - expected) / expected : 0.0;
  if (deviation <= cfg.data.consumed_tolerance) return;
  event(EventKind::kAbort, {{"reason", "consumed_mismatch"},
                            {"samples_served", served},
                            {"samples_expected", expected},
                            {"deviation", deviation}});
  throw RunStopped(fmt::format(
      "data-count mismatch at step {}: the loader took {} samples from the data order but the "
      "trainer consumed {} (deviation {:.1f} % > data.consumed_tolerance {:.1f} %)",
      counters.step, static_cast<int64_t>(served), static_cast<int64_t>(expected), deviation * 100,
      cfg.data.consumed_tolerance * 100));
}

}  // namespace keel::train
