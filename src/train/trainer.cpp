#include "train/trainer.h"

#include <c10/cuda/CUDAFunctions.h>

#include <ctime>
#include <filesystem>

#include "checkpoint/file_io.h"
#include "checkpoint/hf_format.h"
#include "common/error.h"
#include "common/host_allocator.h"
#include "common/log.h"
#include "config/validate.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "optim/clip.h"
#include "schedule/schedule.h"
#include "train/learning_rate.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;

std::atomic<int> g_stop_signal{0};

namespace {

// A signal reaches the ranks at different steps; they stop together, or the ones still training
// would wait on a collective the stopped ones never join. With several ranks every step queues an
// all-reduce (max) of this rank's signal, and its copy for the host, and acts on the previous
// step's: the host never waits for a collective (that one ended a step ago), and every rank reads
// the same value at the same step, the one after the first rank saw the signal.
class StopAgreement {
 public:
  // Called once per step by every rank; the signal to stop on now (0: none).
  int after_step(distributed::Communicator& comm, const torch::Device& device) {
    const int sig = g_stop_signal.load();
    if (!comm.is_process_group()) return sig;
    int agreed = 0;
    if (previous_) {
      previous_->wait();
      agreed = static_cast<int>(previous_->host(0).item<int64_t>());
    }
    std::vector<torch::Tensor> t{
        torch::tensor({static_cast<int64_t>(sig)}, torch::kInt64).to(device)};
    comm.all_reduce_max_(t);
    previous_.emplace();
    previous_->add(t[0]);
    previous_->queued();
    return agreed;
  }

 private:
  std::optional<StepRead> previous_;
};

}  // namespace

void Trainer::State::event(EventKind kind, const nlohmann::json& detail) {
  monitor::JsonRecord rec;
  rec.add("step", counters.step).add("kind", name_of(kind)).add("iteration", counters.iteration);
  if (!detail.empty()) rec.add("detail", detail);
  record.files.write_event(counters.step, name_of(kind), rec);
}

void Trainer::State::event(const guard::GuardEvent& e) {
  event(e.kind, e.record());
  // A warning only in events.jsonl is a warning nobody reads: the console gets it too.
  if ((e.kind == EventKind::kWarn || e.kind == EventKind::kHardwareFault) && comm.is_main()) {
    if (record.progress) record.progress->finish();
    log::warn("guard", "step {}: {}", counters.step,
              e.message.empty() ? e.record().dump() : e.message);
  }
}

void Trainer::State::record_events(const guard::Decision& d) {
  for (const auto& e : d.events)
    if (e.kind != EventKind::kPause && e.kind != EventKind::kAbort) event(e);
}

// The guard decided the run cannot go on: the abort goes on record first, then the run stops.
void Trainer::State::stop(const guard::Decision& d) {
  record_events(d);
  for (const auto& e : d.events)
    if (e.kind == EventKind::kAbort) event(e);
  record.progress->finish();
  throw RunStopped(d.stop_message);
}

// ---- the step ---------------------------------------------------------------------------------
// One optimizer step, top to bottom: the micro-batches' forward and backward (screened: samples
// far above the per-sample baseline are masked out of the loss), the fault hook, the measurements
// (one host read when the guard is on; under update_gate device the update, gated on the device, is
// queued behind it), the guard's decision, then the update's end and its record — or a skip or a
// rollback instead of the update.
void Trainer::State::train_step() {
  // The sqrt rule of the seed's §4.2 when dynamic accumulation changed the batch.
  const double lr =
      effective_lr(cfg, counters.step, counters.iteration, guard.get(), launch.faults.get()) *
      feed.accumulation.lr_factor();
  const bool log_step = is_log_step();
  // A captured forward pass records them at every step: it was captured once, for all steps.
  // The schedule watch's baseline is the attention output before the first update.
  // (A resume of a checkpoint without it, from a run with the guard off, never judges.)
  const bool baseline = guard && guard->needs_attention_baseline() && counters.step == 0;
  model->set_record_activation_stats(log_step || baseline || compute.micro_graph != nullptr);
  const Screen::Bounds screen = defence.screen.bounds(counters.step);

  if (guard) {
    feed.step_start_data = feed.train_data->state();
    feed.step_start_micro = counters.micro_taken;
  }
  MicroBatches micro = forward_backward(/*keep_samples=*/guard != nullptr, screen.high, screen.low);
  if (baseline) guard->set_attention_baseline(attention_std_agreed());
  // ZeRO-3 has reduced the gradients already: a fault changes this rank's reduced part.
  launch.faults->after_backward(counters.iteration, parallel->gradients_after_backward());
  std::optional<monitor::StageRange> range(std::in_place, "keel/measure");
  StepResult result = measure(std::move(micro), screen.high, screen.low);
  range.reset();
  StepTally tally;  // what this attempt adds to the logging window
  tally.loader_wait_s = result.loader_wait_s;
  tally.comm_s = result.comm_s;
  if (guard)
    guarded_update(std::move(result), lr, log_step, tally);
  else
    apply_unguarded(result, lr, log_step, tally);
}

// The guard's part of the step: the host read (and the device's gate), a replay before an alarm
// blames the data, the verdict, then the update's end and its record, or a skip or a rollback
// instead of the update.
void Trainer::State::guarded_update(StepResult result, double lr, bool log_step, StepTally& tally) {
  std::optional<monitor::StageRange> range(std::in_place, "keel/guard");
  if (!defence.replay.calibrated()) calibrate_replay(result);  // before the update is queued
  StepReadout readout = queue_read(result);
  // The gate on the device: the update is queued behind the read, and the host decides while the
  // device updates.
  std::optional<QueuedUpdate> update;
  const auto queue_gated = [&] {
    if (!readout.refuse.defined()) return;
    monitor::StageRange queued("keel/optimizer");  // within the guard's range
    update = queue_update(result, lr, log_step, readout.refuse);
  };
  queue_gated();
  const auto read_start = Clock::now();  // the host's wait for the read, and any replay
  HostFigures figures = readout.read.wait();
  ReplayOutcome replay;
  if (replay_due(figures)) {
    // The alarm refused the update (the gate too): the weights are the step's own still.
    replay = replay_before_blame(result, figures);
    if (replay.redo) {  // a device computed it wrong: the step goes on with the replay's values
      result = std::move(*replay.redo);
      readout = queue_read(result);
    }
    // .grad holds the replay's gradients now: a gated update is queued (clipped) on them again.
    update.reset();
    queue_gated();
    if (replay.redo) figures = readout.read.wait();
  }
  const double read_s = seconds_since(read_start);
  Verdict verdict = decide(result, figures, lr);
  if (replay.seconds && !verdict.decision.events.empty() && !replay.redo)
    verdict.decision.events.front().detail["replay_s"] = *replay.seconds;  // it reproduced
  tally.guard_s = verdict.guard_s + read_s;
  tally.masked = verdict.samples.masked;
  record_verdict(verdict);
  if (verdict.action() != guard::Action::kApply) {
    if (update && !verdict.refused_on_device)
      throw std::logic_error(fmt::format(
          "step {}: the device applied an update that the guard refuses (its pause levels and "
          "its decision disagree)",
          counters.step + 1));
    tally.skipped = true;
    record.step_record->add(tally);
    reject(verdict, result);
    return;
  }
  if (!update) {
    range.emplace("keel/optimizer");
    update = queue_update(result, lr, log_step, torch::Tensor());
  }
  range.emplace("keel/record");
  const std::vector<double> update_ratios =
      finish_update(result, lr, log_step, *update, verdict.refused_on_device);
  tally.clipped = verdict.clipped;
  tally_samples(tally, verdict, result);
  record.step_record->add(tally_applied(tally));
  if (log_step) {
    record_step(result, lr, update_ratios, &verdict);
    check_consumed();
  }
  if (feed.accumulation.dynamic()) adjust_accumulation(verdict);
  if (log_step) act_on_schedule();
}

// The schedule watch read the log step: a back-off is carried out now (the step is on record), or
// the run stops when every back-off is spent.
void Trainer::State::act_on_schedule() {
  if (auto spent = guard->backoffs_spent()) stop(*spent);
  saves.checkpointer->keep_also(guard->schedule_watch().restart_snapshot(counters.step));
  // A copy: carrying it out clears the guard's.
  const std::optional<guard::Backoff> backoff = guard->backoff_due();
  if (!backoff) return;
  defence.recovery->back_off(*backoff);
  // The restored snapshot again, now holding the lowered schedule (step_N is swapped atomically):
  // a resume before the next save keeps the back-off instead of starting over at the old peak.
  save_checkpoint(/*stable=*/true);
  saves.checkpointer->keep_also(guard->schedule_watch().restart_snapshot(counters.step));
}

// Without the guard every step is applied (a non-finite gradient is still refused on the device).
void Trainer::State::apply_unguarded(const StepResult& result, double lr, bool log_step,
                                     StepTally& tally) {
  std::optional<monitor::StageRange> range(std::in_place, "keel/optimizer");
  const QueuedUpdate update = queue_update(result, lr, log_step, torch::Tensor());
  range.emplace("keel/record");
  const std::vector<double> update_ratios = finish_update(result, lr, log_step, update, false);
  record.step_record->add(tally_applied(tally));
  if (!log_step) return;
  record_step(result, lr, update_ratios, nullptr);
  check_consumed();
}

// An applied update in the tally, with the tokens it trained on (all ranks).
StepTally& Trainer::State::tally_applied(StepTally& t) const {
  t.applied = true;
  t.tokens = feed.tokens_per_step / feed.accumulation.nominal() * feed.accumulation.steps();
  return t;
}

// The applied step's norm (read in decide(): dynamic accumulation needs the guard) moves the
// count of the steps that follow.
void Trainer::State::adjust_accumulation(const Verdict& v) {
  const auto change = feed.accumulation.observe(counters.step, v.grad_norm,
                                                guard && guard->in_recovery(counters.step));
  if (!change) return;
  event(EventKind::kGradAccum,
        {{"from", change->from},
         {"to", change->to},
         {"norm_ratio", change->ratio},
         {"lr_factor", feed.accumulation.lr_factor()},
         {"samples_per_step", cfg.data.micro_batch_size * change->to * comm.world_size()}});
}

bool Trainer::State::is_log_step() const {
  const int64_t next = counters.step + 1;
  return next % std::max<int64_t>(cfg.logging.every_steps, 1) == 0 || next == cfg.run.max_steps ||
         counters.step == 0;
}

data::Batch Trainer::State::next_batch() {
  data::Batch batch = feed.train_data->next();
  launch.faults->corrupt(batch,
                         counters.micro_taken);  // corrupt_batch is keyed to the data position
  counters.took_micro_batch();
  return batch;
}

// Averages across ranks, unscales (fp16), and takes the norms: one pass over the gradients gives
// the per-parameter norms (the guard's layer norms) and from them the global norm. A screened
// step's gradients are a sum over the kept samples of 1/samples each: grad_scale makes that a
// mean over the kept ones (folded into clipping, so no extra pass over the gradients).
StepResult Trainer::State::measure(MicroBatches micro, std::optional<double> screen_threshold,
                                   std::optional<double> low_threshold) {
  StepResult r;
  r.samples = std::move(micro.samples);
  r.loader_wait_s = micro.loader_wait_s;
  r.comm_s = micro.comm_s;
  const torch::Tensor& sums = micro.sums;
  {
    const auto comm_start = Clock::now();  // what the backward pass did not hide
    // Gradients averaged over the ranks (an overflow anywhere is then an overflow everywhere);
    // the kept samples' losses and counts summed.
    parallel->reduce();
    std::vector<torch::Tensor> totals{sums};
    comm.all_reduce_sum_(totals);
    if (comm.is_process_group()) r.comm_s += seconds_since(comm_start);
  }
  if (!r.samples.losses.empty())  // what a replay compares (replay.h)
    r.contribution = torch::stack({torch::cat(r.samples.losses).sum().to(torch::kFloat64),
                                   parallel->local_square().to(sums.device(), torch::kFloat64)});
  const std::vector<torch::Tensor>& grads = parallel->gradients();
  if (scaler) r.found_inf = parallel->agree_overflow(scaler->unscale_(grads));
  if (const double growth = launch.faults->gradient_growth(counters.iteration); growth != 1.0)
    for (const auto& p : grads)
      if (p.grad().defined()) p.grad().div_(growth);
  r.loss = sums[0] / sums[1].clamp_min(1.0);  // the mean over every rank's kept samples
  r.kept = sums[1];
  r.param_norms = parallel->param_grad_norms();
  r.screen_threshold = screen_threshold;
  r.low_threshold = screen_threshold ? low_threshold : std::nullopt;
  if (screen_threshold) {
    // The gradients are a sum over the kept samples of 1/samples each; this makes them a mean.
    const int64_t samples =
        cfg.data.micro_batch_size * feed.accumulation.steps() * comm.world_size();
    r.grad_scale = (static_cast<double>(samples) / sums[1].clamp_min(1.0)).reshape({});
    r.param_norms = r.param_norms * r.grad_scale;
  }
  r.grad_norm = r.param_norms.norm();
  r.clip_bound = clip_bound();
  return r;
}

// The global clipping bound of this step. Adaptive mode: a z-score bound on the running grad-norm
// statistics of the applied steps, never above the fixed bound.
double Trainer::State::clip_bound() const {
  double bound = cfg.optim.grad_clip;
  if (guard && cfg.optim.clip_mode == config::ClipMode::kAdaptive && guard->baseline_ready())
    bound = std::min(
        bound, guard->grad_norm_mean() + cfg.optim.adaptive_clip_z * guard->grad_norm_stddev());
  return bound;
}

// Clips and queues the optimizer step. A non-finite gradient never reaches the weights: the
// update is skipped on the device, as is one that `refuse` (the gate) holds back.
QueuedUpdate Trainer::State::queue_update(const StepResult& r, double lr, bool log_step,
                                          const torch::Tensor& refuse) {
  QueuedUpdate u;
  optim::clip_grad_norm_(parallel->gradients(), r.clip_bound, r.grad_norm, r.grad_scale);
  torch::Tensor non_finite = r.grad_norm.isfinite().logical_not().to(torch::kFloat32).reshape({1});
  u.found_inf = r.found_inf ? torch::maximum(*r.found_inf, non_finite) : non_finite;
  // ZeRO-3: the weights are this rank's parts, their norms summed over the ranks.
  if (log_step)  // the weights before, for the update ratio
    u.before = torch::_foreach_mul(parallel->updated_weights(), 1.0);
  u.gated = refuse.defined();
  parallel->optimizer().step(lr, u.gated ? torch::maximum(u.found_inf, refuse) : u.found_inf);
  return u;
}

std::vector<double> Trainer::State::finish_update(const StepResult& r, double lr, bool log_step,
                                                  const QueuedUpdate& u, bool refused_on_device) {
  // The gate held back an update that the guard applies (a grad-norm pause that diagnosis found
  // to be the model's own gradient scale): the skipped step left weights and state untouched, and
  // the gradients are still there.
  if (refused_on_device) parallel->optimizer().step(lr, u.found_inf);
  launch.faults->after_update(counters.iteration, parallel->updated_weights());
  if (scaler) scaler->update(u.found_inf);
  parallel->optimizer().zero_grad();
  defence.grad_norm_window->push(r.grad_norm);
  counters.applied();
  if (guard)
    for (const auto& e : guard->after_update(counters.step)) event(e);
  if (!log_step) return {};

  const std::vector<torch::Tensor>& weights = parallel->updated_weights();
  const torch::Tensor delta_norms = parallel->param_norms(torch::_foreach_sub(weights, u.before));
  const torch::Tensor param_norms = parallel->param_norms(weights);
  auto layer_ratio =
      compute.layers->reduce(delta_norms) / compute.layers->reduce(param_norms).clamp_min(1e-12);
  auto total = (delta_norms.norm() / param_norms.norm().clamp_min(1e-12)).reshape({1});
  auto host = torch::cat({total, layer_ratio}).to(torch::kCPU, torch::kFloat64);
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

Trainer::Trainer(const config::Config& cfg, std::string resolved_yaml, TrainOptions options,
                 distributed::Communicator& comm)
    : s_(std::make_unique<State>(cfg, std::move(resolved_yaml), std::move(options), comm)) {}

Trainer::~Trainer() = default;

void Trainer::run() {
  State& s = *s_;
  s.setup();
  // Every way out through keel's own exits goes on record in starts.jsonl; a crash (kill -9, a
  // segfault) leaves its start open, which the next start records as an abnormal end.
  try {
    loop();
    s.launch.history.record_end(kExitOk, s.counters.step);
  } catch (const Interrupted& e) {
    s.launch.history.record_end(e.exit_code(), s.counters.step);
    throw;
  } catch (const RecordError& e) {
    // The record is gone (disk full, run directory removed): keep what training achieved if the
    // checkpoint directory still takes it, then stop. The checkpoint's own events are not
    // written: that file is what failed.
    s.record.progress->finish();
    log::error("train", "{}", e.what());
    try {
      if (s.saves.last_checkpoint_step != s.counters.step) {
        auto path = s.saves.checkpointer->save(s.counters.step, s.capture(), /*stable=*/false);
        s.saves.checkpointer->wait();
        log::error("train", "last checkpoint written to {}", path.string());
      }
    } catch (const std::exception& ce) {
      log::error("train", "the last checkpoint could not be written either: {}", ce.what());
    }
    throw;
  } catch (const RunStopped&) {
    s.launch.history.record_end(kExitRunStopped, s.counters.step);
    throw;
  } catch (const UserError&) {
    s.launch.history.record_end(kExitUserError, s.counters.step);
    throw;
  }
}

void Trainer::loop() {
  State& s = *s_;
  const auto& cfg = s.cfg;
  const int64_t eval_every = cfg.eval.every_steps;
  const auto start = Clock::now();
  if (s.launch.resumed) {
    s.record_resume();  // on the record, inside run()'s accounting of how the start ended
  } else {
    s.evaluate();
    // A rollback needs a target from the very start: the initial weights are stable by definition.
    if (s.guard && cfg.stability.rollback.enabled) s.save_checkpoint(/*stable=*/true);
  }
  const auto beat = [&s] {
    s.launch.history.beat({s.counters.step, s.counters.iteration, s.counters.micro_taken});
  };
  beat();
  s.launch.start_iteration = s.counters.iteration;
  s.start_profiler();
  StopAgreement stop_agreement;
  while (s.counters.step < cfg.run.max_steps) {
    if (s.record.profiler) s.record.profiler->before(s.counters.step + 1);
    {
      monitor::StageRange range("keel/step");
      s.train_step();
    }
    beat();
    if (s.record.memory_watch->due(s.counters.iteration - s.launch.start_iteration))
      s.event(EventKind::kMemory, s.record.memory_watch->record(s.comm));
    const int64_t step = s.counters.step;
    const bool last = step == cfg.run.max_steps;
    const bool due = eval_every > 0 && step % eval_every == 0 && step != s.counters.last_eval_step;
    if (last || due) s.evaluate();
    s.maybe_checkpoint();
    if (s.record.profiler) s.finish_profile(last);
    if (int sig = stop_agreement.after_step(s.comm, s.device); sig != 0 && !last) {
      s.record.progress->finish();
      log::warn("train", "signal {} at step {}: writing a checkpoint before exiting", sig, step);
      if (s.saves.last_checkpoint_step != step) s.save_checkpoint(/*stable=*/false);
      s.saves.checkpointer->wait();
      s.event(EventKind::kInterrupted, {{"signal", sig}});
      throw Interrupted(sig);
    }
  }
  if (s.saves.last_checkpoint_step != s.counters.step) s.save_checkpoint(/*stable=*/false);
  s.saves.checkpointer->wait();
  s.record.progress->finish();
  const double elapsed = seconds_since(start);
  log::info("train", "done: {} steps in {}, final loss {:.4f}, val_loss {:.4f}", s.counters.step,
            monitor::format_duration(elapsed), s.loss_logged(), s.record.last_val_loss);
  s.event(EventKind::kRunEnd, {{"seconds", elapsed},
                               {"loss", s.loss_logged()},
                               {"val_loss", s.record.last_val_loss},
                               {"rollbacks", s.guard ? s.guard->rollbacks() : 0}});
}

double Trainer::last_loss() const { return s_->loss_logged(); }
double Trainer::last_val_loss() const { return s_->record.last_val_loss; }

}  // namespace keel::train
