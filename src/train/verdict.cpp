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
// `rank_norms` (several ranks): every rank's global norm; replicas that disagree refuse the
// update too (Guard::replicas_disagree).
torch::Tensor refusal(const StepResult& r, const guard::PauseLevels& levels,
                      const torch::Tensor& rank_norms) {
  const auto fp64 = [](const torch::Tensor& t) { return t.reshape({}).to(torch::kFloat64); };
  const torch::Tensor overflow =
      r.found_inf ? fp64(*r.found_inf) : torch::zeros({}, r.loss.options().dtype(torch::kFloat64));
  torch::Tensor refuse =
      guard::refuses_update(levels, fp64(r.loss), fp64(r.grad_norm), overflow, fp64(r.kept));
  if (rank_norms.defined())
    refuse = refuse.logical_or(rank_norms.ne(r.grad_norm.reshape({1})).any());
  return refuse.to(torch::kFloat32).reshape({1});
}

}  // namespace

// One host read per step, queued behind the step's measurements: the loss, the norms, the fp16
// overflow flag and scale, and every rank's per-sample losses, screen flags, ids and fingerprints,
// so that every rank feeds its guard the same values and takes the same decision.
StepReadout Trainer::State::queue_read(const StepResult& r) {
  torch::NoGradGuard no_grad;  // the loss still carries its graph
  const StepSamples& samples = r.samples;
  const auto dev = r.loss.device();
  DeviceFigures f;
  // Replicated ranks hold the same reduced gradients, so the same norm to the bit: each rank's,
  // to tell a device that computed wrong (under ZeRO every rank's norm is a sum over the ranks).
  // With it, each rank's own part of the step, for a replay (replay.h) to compare.
  if (comm.world_size() > 1) {
    const auto all =
        comm.all_gather(torch::cat({r.grad_norm.reshape({1}).to(torch::kFloat64), r.contribution}))
            .reshape({comm.world_size(), 3});
    f.rank_grad_norms = all.select(1, 0);
    f.contributions = all.slice(1, 1);
  } else {
    f.contributions = r.contribution.reshape({1, 2});
  }
  torch::Tensor refuse;
  if (cfg.stability.update_gate == config::UpdateGate::kDevice)
    refuse = refusal(r, guard->pause_levels(counters.step), f.rank_grad_norms);
  f.loss = r.loss;
  f.grad_norm = r.grad_norm;
  if (r.found_inf) f.overflow = *r.found_inf;
  f.refused = refuse;
  if (scaler) f.loss_scale = scaler->scale();
  f.layer_grad_norms = compute.layers->reduce(r.param_norms);
  f.sample_losses = comm.all_gather(torch::cat(samples.losses).to(dev));
  if (r.screen_threshold) f.kept = comm.all_gather(torch::cat(samples.keep).to(dev));
  const auto pairs = torch::stack({torch::cat(samples.ids).to(torch::kCPU, torch::kInt64),
                                   torch::tensor(samples.fingerprints, torch::kInt64)},
                                  1);  // (n, 2)
  // One rank's are on the host already; several ranks gather theirs through the device.
  f.pairs = comm.is_process_group() ? comm.all_gather(pairs.to(device)) : pairs;
  return StepReadout{HostRead(f), refuse};
}

Verdict Trainer::State::decide(const StepResult& r, const HostFigures& h, double lr) {
  Verdict v;
  const auto start = Clock::now();
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
  if (!guard::replicas_agree(h.rank_grad_norms)) {  // not the data's doing, nor the model's
    // Two ranks hold no majority: the one whose own part (replay.h's Contribution) stood out.
    v.decision = guard->replicas_disagree(s, h.rank_grad_norms,
                                          h.contributions.size() == 2
                                              ? std::optional(ReplayCheck::suspect(h.contributions))
                                              : std::nullopt);
    for (auto& e : v.decision.events) e.detail["hosts"] = launch.rank_hosts;
    v.signals = {{"rank_grad_norms", h.rank_grad_norms}, {"lr", lr}};
    v.guard_s = seconds_since(start);
    return v;
  }
  defence.screen.observe(h, {r.screen_threshold, r.low_threshold}, s, v.samples);
  v.grad_norm = s.grad_norm;
  v.layer_grad_norms = s.layer_grad_norms;
  v.decision = guard->observe(s);
  defence.screen.name_low_samples(v.samples, v.decision);
  if (v.decision.needs_diagnosis) {
    // Is the model worse than the snapshot a rollback would restore, on data known to be clean?
    const double ratio = probe_loss() / defence.probe_reference;
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
  defence.screen.quarantine_masked(v.samples, counters, v.decision);
  if (v.action() == guard::Action::kAbort && !v.decision.faulty_ranks.empty())
    stop_faulty_device(v.decision, /*in_step=*/true);
  if (v.action() == guard::Action::kAbort) stop(v.decision);
  record_events(v.decision);
}

// A step the guard did not apply: weights and optimizer state stay untouched, the data moves on.
void Trainer::State::reject(const Verdict& v, const StepResult& r) {
  if (scaler && r.found_inf) scaler->update(*r.found_inf);
  parallel->optimizer().zero_grad();
  counters.rejected();
  const StepEvidence evidence{v, r.samples};
  if (v.action() == guard::Action::kPause) defence.recovery->rollback(evidence);
  if (v.decision.skip_reason == guard::SkipReason::kIncident ||
      v.decision.skip_reason == guard::SkipReason::kData)
    defence.recovery->drop_step(evidence);
}

}  // namespace keel::train
