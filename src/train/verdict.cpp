// The guard's verdict on a step: its values queued for the host (with, under
// stability.update_gate: device, the device's own verdict on the update, so the update need not
// wait for the host), the host's decision on them, and its record.
#include <stdexcept>

#include "common/clock.h"
#include "common/quarantine_reason.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace {

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// The device's verdict on the update (guard::refuses_update), compared in fp64 on the values the
// host will read, so both sides agree to the bit.
torch::Tensor refusal(const StepResult& r, const guard::PauseLevels& levels) {
  const auto fp64 = [](const torch::Tensor& t) { return t.reshape({}).to(torch::kFloat64); };
  const torch::Tensor overflow =
      r.found_inf ? fp64(*r.found_inf) : torch::zeros({}, r.loss.options().dtype(torch::kFloat64));
  return guard::refuses_update(levels, fp64(r.loss), fp64(r.grad_norm), overflow, fp64(r.kept))
      .to(torch::kFloat32)
      .reshape({1});
}

}  // namespace

// One host read per step, queued behind the step's measurements: the loss, the norms, the fp16
// overflow flag and scale, and every rank's per-sample losses, screen flags, ids and fingerprints,
// so that every rank feeds its guard the same values and takes the same decision.
StepReadout Trainer::State::queue_read(const StepResult& r) {
  torch::NoGradGuard no_grad;  // the loss still carries its graph
  const StepSamples& samples = r.samples;
  torch::Tensor refuse;
  if (cfg.stability.update_gate == config::UpdateGate::kDevice)
    refuse = refusal(r, guard->pause_levels(counters.step));
  const auto dev = r.loss.device();
  DeviceFigures f;
  f.loss = r.loss;
  f.grad_norm = r.grad_norm;
  if (r.found_inf) f.overflow = *r.found_inf;
  f.refused = refuse;
  if (scaler) f.loss_scale = scaler->scale();
  f.layer_grad_norms = layers->reduce(r.param_norms);
  f.sample_losses = comm.all_gather(torch::cat(samples.losses).to(dev));
  if (r.screen_threshold) f.kept = comm.all_gather(torch::cat(samples.keep).to(dev));
  const auto pairs = torch::stack({torch::cat(samples.ids).to(torch::kCPU, torch::kInt64),
                                   torch::tensor(samples.fingerprints, torch::kInt64)},
                                  1);  // (n, 2)
  // One rank's are on the host already; several ranks gather theirs through the device.
  f.pairs = comm.is_process_group() ? comm.all_gather(pairs.to(device)) : pairs;
  return StepReadout{HostRead(f), refuse};
}

Verdict Trainer::State::decide(const StepResult& r, StepReadout& readout, double lr) {
  Verdict v;
  const auto start = Clock::now();
  const HostFigures h = readout.read.wait();
  const auto n = static_cast<int64_t>(h.ids.size());
  v.refused_on_device = h.refused_on_device;

  guard::StepSignals s;
  s.step = counters.step;
  s.iteration = counters.iteration;
  s.loss = h.loss;
  s.grad_norm = h.grad_norm;
  s.overflow = h.overflow;
  s.layer_grad_norms = h.layer_grad_norms;
  s.clipped = s.grad_norm > r.clip_bound;
  s.loss_scale = h.loss_scale;
  s.samples = n;
  s.screen_threshold = r.screen_threshold;
  HostSamples& samples = v.samples;
  samples.ids = h.ids;
  samples.losses = h.sample_losses;
  samples.kept = h.kept;
  observe_repeats(s, h, r, samples);
  for (int64_t i = 0; i < n; ++i) {
    const double loss = samples.losses[i];
    // A masked sample below the high bound was masked for the low side (screen.low quarantine).
    if (samples.kept[i])
      s.kept_losses.push_back(loss);
    else if (!(r.screen_threshold && loss <= *r.screen_threshold))
      s.masked_losses.push_back(loss);
    samples.masked += !samples.kept[i];
  }
  v.grad_norm = s.grad_norm;
  v.layer_grad_norms = s.layer_grad_norms;
  v.decision = guard->observe(s);
  name_low_samples(samples, v.decision);
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
  v.clipped = v.action() == guard::Action::kApply && s.clipped;
  v.guard_s = seconds_since(start);
  return v;
}

// The verdict on record: the screen's masked samples in quarantine.jsonl (named in its screen
// events), the guard's events, and the end of the run when it aborts.
void Trainer::State::record_verdict(Verdict& v) {
  quarantine_screened(v.samples, v.decision);
  if (v.action() == guard::Action::kAbort) stop(v.decision);
  record_events(v.decision);
}

void Trainer::State::quarantine_screened(const HostSamples& host_samples, guard::Decision& d) {
  if (host_samples.masked == 0) return;
  const bool low_masking = cfg.stability.screen.low == config::LowScreen::kQuarantine;
  std::vector<std::pair<double, int64_t>> masked;  // (loss, id)
  for (size_t i = 0; i < host_samples.ids.size(); ++i) {
    if (host_samples.kept[i]) continue;
    if (!low_masking || !host_samples.low_side(i)) {
      masked.emplace_back(host_samples.losses[i], host_samples.ids[i]);
    } else if (host_samples.duplicate_of[i] >= 0) {
      quarantine.record(host_samples.ids[i], counters, name_of(QuarantineReason::kRepeatedData),
                        host_samples.losses[i], {{"duplicate_of", host_samples.duplicate_of[i]}});
    } else {
      quarantine.record(host_samples.ids[i], counters, name_of(QuarantineReason::kLowLoss),
                        host_samples.losses[i]);
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
  parallel->optimizer().zero_grad();
  counters.rejected();
  const StepEvidence evidence{v, r.samples};
  if (v.action() == guard::Action::kPause) recovery->rollback(evidence);
  if (v.decision.skip_reason == guard::SkipReason::kIncident ||
      v.decision.skip_reason == guard::SkipReason::kData)
    recovery->drop_step(evidence);
}

}  // namespace keel::train
