// The record of applied steps (step_record.h), the trainer's figures for it, and the
// consumed-vs-steps cross-check that runs at log steps with it.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "common/error.h"
#include "train/step_record.h"
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

nlohmann::json data_statistics(const std::vector<double>& kept_losses,
                               const std::vector<int64_t>& doc_lengths,
                               const std::vector<int64_t>& buckets) {
  nlohmann::json out = nlohmann::json::object();
  std::vector<double> losses;
  for (double l : kept_losses)
    if (std::isfinite(l)) losses.push_back(l);
  if (!losses.empty()) {
    const double mean = std::accumulate(losses.begin(), losses.end(), 0.0) / losses.size();
    const double max = *std::max_element(losses.begin(), losses.end());
    out["sample_loss"] = {{"n", losses.size()},
                          {"mean", mean},
                          {"p50", quantile(losses, 0.5)},
                          {"p99", quantile(losses, 0.99)},
                          {"max", max}};
  }
  if (!doc_lengths.empty()) {
    std::vector<double> v(doc_lengths.begin(), doc_lengths.end());
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    out["doc_len"] = {{"mean", mean},
                      {"p50", quantile(v, 0.5)},
                      {"p95", quantile(v, 0.95)},
                      {"p99", quantile(v, 0.99)},
                      {"max", *std::max_element(v.begin(), v.end())}};
  }
  if (!buckets.empty()) {
    std::map<int64_t, int64_t> mix;
    for (int64_t b : buckets) ++mix[b];
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [bucket, count] : mix) j[std::to_string(bucket)] = count;
    out["bucket_mix"] = j;
  }
  return out;
}

void StepRecord::write(const StepFigures& f) {
  last_loss_ = f.loss;
  const LogWindow& w = window_;
  const double elapsed = seconds_since(w.start);
  const int64_t steps = std::max<int64_t>(w.steps, 1);
  const double tokens_per_s = w.tokens / std::max(elapsed, 1e-9);
  const double step_ms = elapsed * 1e3 / steps;

  monitor::JsonRecord rec;
  rec.add("step", f.step)
      .add("loss", f.loss)
      .add("lr", f.lr)
      .add("grad_norm", f.grad_norm)
      .add("grad_norm_median", f.grad_norm_median)
      .add("clipped", f.grad_norm > f.clip_bound)
      .add("clip_bound", f.clip_bound)
      .add("update_ratio", f.update_ratio)
      .add("tokens_per_s", tokens_per_s)
      .add("step_ms", step_ms)
      .add("loader_wait_ms", w.loader_wait_s * 1e3 / steps)
      .add("guard_ms", w.guard_s * 1e3 / steps)
      .add("queue_depth", f.queue_depth);
  if (f.guarded) rec.add("clip_rate", static_cast<double>(w.clipped) / steps);
  if (f.loss_scale) rec.add("loss_scale", *f.loss_scale);
  if (f.several_ranks) rec.add("comm_ms", w.comm_s * 1e3 / steps);
  if (f.stragglers)
    rec.add("slowest_rank", f.stragglers->slowest_rank)
        .add("rank_lag_ms", f.stragglers->lag_ms)
        .add("median_rank_work_ms", f.stragglers->median_ms);
  rec.add("tokens_seen", f.tokens_seen).add("samples_seen", f.samples_seen);
  if (f.grad_accum) rec.add("grad_accum", *f.grad_accum);
  if (f.guarded) {
    nlohmann::json per_layer = nlohmann::json::object(), layer_norms = nlohmann::json::object();
    for (const auto& [name, ratio] : f.layer_update_ratios) per_layer[name] = ratio;
    for (const auto& [name, norm] : f.layer_grad_norms) layer_norms[name] = norm;
    rec.add("update_ratio_layers", per_layer).add("grad_norm_layers", layer_norms);
    rec.add("skipped_steps", w.skipped).add("masked_samples", w.masked);
    if (f.screen_threshold) rec.add("screen_threshold", *f.screen_threshold);
    for (const auto& [key, value] : f.data_statistics.items()) rec.add(key, value);
    if (f.in_recovery) rec.add("recovery", true);
  }
  if (!f.attention_output_std.empty()) {
    nlohmann::json per_layer = nlohmann::json::object();
    for (const auto& [name, std] : f.attention_output_std) per_layer[name] = std;
    rec.add("attn_out_std", per_layer);
  }
  if (f.attention_growth) rec.add("attn_growth", *f.attention_growth);
  files_->write_metrics(f.step, rec);

  monitor::ProgressSample ps;
  ps.step = f.step;
  ps.max_steps = max_steps_;
  ps.loss = f.loss;
  ps.lr = f.lr;
  ps.grad_norm = f.grad_norm;
  ps.tokens_per_s = tokens_per_s;
  ps.step_ms = step_ms;
  ps.loss_floor = loss_floor_.value_or(-1.0);
  ps.tokens_seen = f.tokens_seen;
  progress_->update(ps);
  window_ = LogWindow();
}

namespace {

std::vector<int64_t> to_vector(const std::vector<torch::Tensor>& parts) {
  if (parts.empty()) return {};
  const auto t = torch::cat(parts).to(torch::kInt64).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

}  // namespace

void StepRecord::add(const StepTally& t) {
  LogWindow& w = window_;
  w.loader_wait_s += t.loader_wait_s;
  w.guard_s += t.guard_s;
  w.comm_s += t.comm_s;
  w.steps += t.applied;
  w.tokens += t.tokens;
  w.clipped += t.clipped;
  w.skipped += t.skipped;
  w.masked += t.masked;
  w.kept_losses.insert(w.kept_losses.end(), t.kept_losses.begin(), t.kept_losses.end());
  w.doc_lengths.insert(w.doc_lengths.end(), t.doc_lengths.begin(), t.doc_lengths.end());
  w.buckets.insert(w.buckets.end(), t.buckets.begin(), t.buckets.end());
}

// The figures of the step that closes the logging window, and the guard's periodic signals
// (update ratios, attention drift), whose warnings follow the metrics line. `update_ratios` is
// {total, per layer...} from apply_update.
void Trainer::State::record_step(const StepResult& r, double lr,
                                 const std::vector<double>& update_ratios, const Verdict* v) {
  const LogWindow& window = record.step_record->window();
  const std::vector<double> layer_ratios(update_ratios.begin() + 1, update_ratios.end());
  data::LoaderStats loader = feed.train_data->take_stats();
  std::vector<guard::GuardEvent> periodic;
  const std::vector<double> attention = attention_std_agreed();
  if (guard) {
    const auto start = Clock::now();
    periodic = guard->observe_periodic(counters.step, layer_ratios, attention, lr);
    StepTally periodic_time;
    periodic_time.guard_s = seconds_since(start);
    record.step_record->add(periodic_time);
  }
  if (loader.waits > 0)
    event(EventKind::kLoaderWait, {{"wait_ms", loader.wait_ms}, {"waits", loader.waits}});

  StepFigures f;
  f.step = counters.step;
  f.loss = r.loss.item<double>();
  f.lr = lr;
  f.grad_norm = r.grad_norm.item<double>();
  f.grad_norm_median = guard ? guard->grad_norm_median() : defence.grad_norm_window->median();
  f.clip_bound = r.clip_bound;
  f.update_ratio = update_ratios.front();
  f.queue_depth = loader.queue_depth;
  f.samples_seen = counters.samples_seen(cfg.data.micro_batch_size, comm.world_size());
  f.tokens_seen = f.samples_seen * cfg.model.seq_len;
  if (feed.accumulation.dynamic()) f.grad_accum = feed.accumulation.steps();
  if (scaler) f.loss_scale = scaler->scale().item<double>();
  f.several_ranks = comm.is_process_group();
  if (guard) {
    f.guarded = true;
    const auto& names = compute.layers->names();
    for (size_t i = 0; i < layer_ratios.size(); ++i)
      f.layer_update_ratios.emplace_back(names[i], layer_ratios[i]);
    for (size_t i = 0; v && i < v->layer_grad_norms.size() && i < names.size(); ++i)
      f.layer_grad_norms.emplace_back(names[i], v->layer_grad_norms[i]);
    f.screen_threshold = r.screen_threshold;
    f.data_statistics = data_statistics(window.kept_losses, window.doc_lengths, window.buckets);
    f.in_recovery = guard->in_recovery(counters.step);
    f.attention_growth = guard->schedule_watch().growth(attention);
  }
  const auto prefixes = model->layer_prefixes();
  for (size_t i = 0; i < attention.size() && i < prefixes.size(); ++i)
    f.attention_output_std.emplace_back(prefixes[i].substr(0, prefixes[i].size() - 1),
                                        attention[i]);
  std::optional<int> straggler;
  if (comm.is_process_group()) {
    f.stragglers = monitor::StragglerWatch::figures(ranks_work_ms(window));
    if (f.stragglers && comm.is_main()) straggler = record.stragglers.observe(*f.stragglers);
  }
  record.step_record->write(f);
  for (const auto& e : periodic) event(e);
  if (straggler) event(straggler_warning(*f.stragglers));
}

// Every rank's own work per applied step in the closing window: its time less what it waited
// for collectives. One all-gather of a number per rank, at logged steps only.
std::vector<double> Trainer::State::ranks_work_ms(const LogWindow& window) {
  const double waited = comm.seconds_waiting() - record.waited_s;
  const double own_s = std::max(seconds_since(window.start) - waited, 0.0);
  const double per_step_ms = own_s * 1e3 / static_cast<double>(std::max<int64_t>(window.steps, 1));
  const auto all =
      comm.all_gather(torch::tensor({per_step_ms}, torch::kFloat64).to(device)).to(torch::kCPU);
  record.waited_s = comm.seconds_waiting();  // the gather's own wait belongs to the next window
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

guard::GuardEvent Trainer::State::straggler_warning(const monitor::StragglerFigures& f) const {
  const std::string host = comm.host_of(f.slowest_rank);
  const int windows = record.stragglers.streak();
  const std::string message = fmt::format(
      "rank {}{} is the slowest rank in {} logged windows in a row: its own work takes {:.1f} ms a "
      "step against the median rank's {:.1f} ms (+{:.0f} %), and every other rank waits for it; "
      "look at that machine (thermal throttling, another job on it, its data loader, a slow link)",
      f.slowest_rank, host.empty() ? "" : " on host " + host, windows, f.slowest_ms, f.median_ms,
      100.0 * f.lag_ms / std::max(f.median_ms, 1e-9));
  nlohmann::json detail = {
      {"signal", "straggler"},        {"rank", f.slowest_rank},        {"lag_ms", f.lag_ms},
      {"rank_work_ms", f.slowest_ms}, {"median_work_ms", f.median_ms}, {"windows", windows}};
  if (!host.empty()) detail["host"] = host;
  return guard::GuardEvent(EventKind::kWarn, detail, message);
}

std::vector<double> Trainer::State::attention_std_agreed() {
  std::vector<double> stds = model->attention_output_std();
  if (stds.empty() || !comm.is_process_group()) return stds;
  std::vector<torch::Tensor> t{torch::tensor(stds, torch::kFloat64).to(device)};
  comm.all_reduce_mean_(t);
  const auto host = t[0].to(torch::kCPU).contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

// The applied step's kept samples, for the logging window's data statistics.
void Trainer::State::tally_samples(StepTally& t, const Verdict& v, const StepResult& r) const {
  for (size_t i = 0; i < v.samples.losses.size(); ++i)
    if (v.samples.kept[i]) t.kept_losses.push_back(v.samples.losses[i]);
  t.doc_lengths = to_vector(r.samples.doc_lengths);
  t.buckets = to_vector(r.samples.buckets);
}

// The samples the loader took from the data order must match what the trainer asked for: a
// silent loss or repeat of data would otherwise go unnoticed for days.
void Trainer::State::check_consumed() {
  auto counts =
      torch::tensor({static_cast<double>(feed.train_data->samples_served()),
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
