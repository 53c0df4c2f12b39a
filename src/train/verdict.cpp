// The guard's verdict on a step: its values queued for the host (with, under
// stability.update_gate: device, the device's own verdict on the update, so the update need not
// wait for the host), the host's decision on them, and its record.
#include <stdexcept>

#include "common/clock.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace {

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// The device's verdict on the update: 1 where the guard will refuse it. observe() refuses exactly
// the steps with a non-finite loss or gradient norm, an fp16 overflow, no sample kept by the
// screen, or a value past its pause level (guard::PauseLevels); the comparisons are made in fp64
// on the same values the host reads, so both sides agree to the bit.
torch::Tensor refusal(const StepResult& r, const guard::PauseLevels& levels) {
  const auto loss = r.loss.to(torch::kFloat64), norm = r.grad_norm.to(torch::kFloat64);
  auto refuse = loss.isfinite().logical_and(norm.isfinite()).logical_not();
  refuse = refuse.logical_or(r.kept.le(0)).logical_or(norm.gt(levels.grad_norm));
  refuse = refuse.logical_or(loss.gt(levels.loss));
  if (r.found_inf) refuse = refuse.logical_or(r.found_inf->reshape({}).gt(0));
  return refuse.to(torch::kFloat32).reshape({1});
}

}  // namespace

// One host read per step, queued behind the step's measurements: the loss, the norms, the fp16
// overflow flag and scale, and every rank's per-sample losses, screen flags, ids and fingerprints,
// so that every rank feeds its guard the same values and takes the same decision.
StepReadout Trainer::State::queue_read(const StepResult& r) {
  torch::NoGradGuard no_grad;  // the loss still carries its graph
  StepReadout out;
  const auto dev = r.loss.options();
  if (cfg.stability.update_gate == config::UpdateGate::kDevice)
    out.refuse = refusal(r, guard->pause_levels(counters.step));
  std::vector<torch::Tensor> parts = {
      r.loss.reshape({1}),
      r.grad_norm.reshape({1}),
      r.found_inf ? r.found_inf->reshape({1}).to(dev) : torch::zeros({1}, dev),
      out.refuse.defined() ? out.refuse : torch::zeros({1}, dev),
      scaler ? scaler->scale().reshape({1}).to(dev) : torch::zeros({1}, dev),
      layers->reduce(r.param_norms)};
  parts.push_back(comm.all_gather(torch::cat(step_samples.losses).to(dev)));
  if (r.screen_threshold) parts.push_back(comm.all_gather(torch::cat(step_samples.keep).to(dev)));
  out.values = out.read.add(torch::cat(parts).to(torch::kFloat64));
  const auto pairs = torch::stack({torch::cat(step_samples.ids).to(torch::kCPU, torch::kInt64),
                                   torch::tensor(step_samples.fingerprints, torch::kInt64)},
                                  1);  // (n, 2)
  // One rank's are on the host already; several ranks gather theirs through the device.
  out.pairs = out.read.add(comm.is_process_group() ? comm.all_gather(pairs.to(device)) : pairs);
  out.read.queued();
  return out;
}

Verdict Trainer::State::decide(const StepResult& r, StepReadout& readout, double lr) {
  Verdict v;
  const auto start = Clock::now();
  readout.read.wait();
  const auto& packed = readout.read.host(readout.values);
  const auto& pairs = readout.read.host(readout.pairs);
  const double* p = packed.data_ptr<double>();
  const int64_t n_layers = static_cast<int64_t>(layers->names().size());
  const int64_t n = pairs.size(0);
  const double* sample_loss = p + 5 + n_layers;
  const double* keep = r.screen_threshold ? sample_loss + n : nullptr;
  v.refused_on_device = p[3] > 0;

  guard::StepSignals s;
  s.step = counters.step;
  s.iteration = counters.iteration;
  s.loss = p[0];
  s.grad_norm = p[1];
  s.overflow = p[2] > 0;
  s.layer_grad_norms.assign(p + 5, p + 5 + n_layers);
  s.clipped = s.grad_norm > r.clip_bound;
  if (scaler) s.loss_scale = p[4];
  s.samples = n;
  s.screen_threshold = r.screen_threshold;
  host_samples = HostSamples();
  for (int64_t i = 0; i < n; ++i) {
    host_samples.ids.push_back(pairs.data_ptr<int64_t>()[2 * i]);
    host_samples.losses.push_back(sample_loss[i]);
    host_samples.kept.push_back(!keep || keep[i] > 0.5);
  }
  observe_repeats(s, pairs, r);
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = host_samples.kept[i];
    // A masked sample below the high bound was masked for the low side (screen.low quarantine).
    if (kept)
      s.kept_losses.push_back(sample_loss[i]);
    else if (!(r.screen_threshold && sample_loss[i] <= *r.screen_threshold))
      s.masked_losses.push_back(sample_loss[i]);
    host_samples.masked += !kept;
  }
  last_layer_grad_norms = s.layer_grad_norms;
  v.decision = guard->observe(s);
  name_low_samples(v.decision);
  if (v.decision.needs_diagnosis) {
    // Is the model worse than the snapshot a rollback would restore, on data known to be clean?
    const double ratio = probe_loss() / probe_reference;
    v.decision = guard->resolve(std::move(v.decision), ratio);
  }
  v.signals = {{"loss", finite_or_null(s.loss)},
               {"grad_norm", finite_or_null(s.grad_norm)},
               {"lr", lr},
               {"clip_bound", r.clip_bound},
               {"layer_grad_norms", s.layer_grad_norms}};
  if (v.action() == guard::Action::kApply && s.clipped) ++step_record->window().clipped;
  step_record->window().masked += host_samples.masked;
  step_record->window().guard_s += seconds_since(start);
  return v;
}

// The verdict on record: the screen's masked samples in quarantine.jsonl (named in its screen
// events), the guard's events, and the end of the run when it aborts.
void Trainer::State::record_verdict(Verdict& v) {
  quarantine_screened(v.decision);
  if (v.action() == guard::Action::kAbort) stop(v.decision);
  record_events(v.decision);
}

void Trainer::State::quarantine_screened(guard::Decision& d) {
  if (host_samples.masked == 0) return;
  const bool low_masking = cfg.stability.screen.low == config::LowScreen::kQuarantine;
  std::vector<std::pair<double, int64_t>> masked;  // (loss, id)
  for (size_t i = 0; i < host_samples.ids.size(); ++i) {
    if (host_samples.kept[i]) continue;
    if (!low_masking || !host_samples.low_side(i)) {
      masked.emplace_back(host_samples.losses[i], host_samples.ids[i]);
    } else if (host_samples.duplicate_of[i] >= 0) {
      quarantine.record(host_samples.ids[i], counters, "repeated_data", host_samples.losses[i],
                        {{"duplicate_of", host_samples.duplicate_of[i]}});
    } else {
      quarantine.record(host_samples.ids[i], counters, "low_loss", host_samples.losses[i]);
    }
  }
  if (masked.empty()) return;
  const nlohmann::json named =
      quarantine.record_screened(std::move(masked), counters, cfg.stability.top_k_samples);
  for (auto& e : d.events)
    if (e.about_screened_samples) e.name_samples(named);
}

// A step the guard did not apply: weights and optimizer state stay untouched, the data moves on.
void Trainer::State::reject(const Verdict& v, const StepResult& r) {
  if (scaler && r.found_inf) scaler->update(*r.found_inf);
  optimizer->zero_grad();
  counters.rejected();
  ++step_record->window().skipped;
  const StepEvidence evidence{v, host_samples, step_samples};
  if (v.action() == guard::Action::kPause) recovery->rollback(evidence);
  if (v.decision.skip_reason == guard::SkipReason::kIncident ||
      v.decision.skip_reason == guard::SkipReason::kData)
    recovery->drop_step(evidence);
}

}  // namespace keel::train
