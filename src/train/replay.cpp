// Replay before blame (replay.h): the check's rules, and the trainer's replay of a step.
#include "train/replay.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/ranges.h>
#include <xxhash.h>

#include <map>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;

// ---- the check's rules --------------------------------------------------------------------------

void ReplayCheck::remember_rng(torch::Device device, int64_t micro) {
  const auto at = static_cast<size_t>(micro);
  if (rng_cpu_.size() <= at) rng_cpu_.resize(at + 1), rng_device_.resize(at + 1);
  rng_cpu_[at] = at::globalContext().defaultGenerator(torch::kCPU).get_state();
  if (device.is_cuda()) rng_device_[at] = at::globalContext().defaultGenerator(device).get_state();
}

void ReplayCheck::restore_rng(torch::Device device, int64_t micro) const {
  const auto set = [](at::Generator gen, const torch::Tensor& state) {
    if (!state.defined()) return;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  };
  const auto at = static_cast<size_t>(micro);
  if (at >= rng_cpu_.size()) return;
  set(at::globalContext().defaultGenerator(torch::kCPU), rng_cpu_[at]);
  if (device.is_cuda()) set(at::globalContext().defaultGenerator(device), rng_device_[at]);
}

void ReplayCheck::calibrate(double noise) { noise_ = std::isfinite(noise) ? noise : HUGE_VAL; }

double ReplayCheck::tolerance() const {
  const double n = noise();
  return n == 0.0 ? 0.0 : std::max(kReplayToleranceFactor * n, 1e-6);
}

double ReplayCheck::difference(const Contribution& a, const Contribution& b) {
  const auto one = [](double x, double y) {
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y) ? 0.0 : HUGE_VAL;
    if (x == y) return 0.0;  // the same infinity too
    return std::abs(x - y) / std::max({std::abs(x), std::abs(y), 1e-300});
  };
  return std::max(one(a.loss_sum, b.loss_sum), one(a.grad_square, b.grad_square));
}

std::vector<double> ReplayCheck::differences(const std::vector<Contribution>& step,
                                             const std::vector<Contribution>& replay,
                                             int64_t shift) {
  const auto world = static_cast<int64_t>(step.size());
  std::vector<double> out(step.size(), 0.0);
  for (int64_t b = 0; b < world; ++b) out[b] = difference(step[b], replay[(b + shift) % world]);
  return out;
}

int64_t ReplayCheck::suspect(const std::vector<Contribution>& parts) {
  int64_t best = 0;
  for (size_t r = 0; r < parts.size(); ++r) {
    const auto& p = parts[r];
    if (!std::isfinite(p.loss_sum) || !std::isfinite(p.grad_square)) return static_cast<int64_t>(r);
    if (p.grad_square > parts[best].grad_square) best = static_cast<int64_t>(r);
  }
  return best;
}

ReplayCheck::Finding ReplayCheck::judge(const std::vector<double>& differences,
                                        const std::vector<Contribution>& step, int64_t shift,
                                        double global_difference) const {
  Finding f;
  const auto world = static_cast<int64_t>(differences.size());
  const double tol = tolerance();
  const auto differs = [&](int64_t b) { return differences[((b % world) + world) % world] > tol; };
  // Device d computed its own data in the step and rank d-shift's in the replay: a device wrong
  // in both is wrong every time. Two ranks share both pairs: the one whose part stood out.
  if (shift != 0) {
    if (world == 2 && differs(0) && differs(1)) {
      f.persistent.push_back(suspect(step));
    } else if (world > 2) {
      for (int64_t d = 0; d < world; ++d)
        if (differs(d) && differs(d - shift)) f.persistent.push_back(d);
    }
  }
  const auto explained = [&](int64_t b) {
    for (int64_t d : f.persistent)
      if (d == b || d == (b + shift) % world) return true;
    return false;
  };
  for (int64_t b = 0; b < world; ++b)
    if (differs(b) && !explained(b)) f.transient.push_back(b);
  f.global_differs = f.transient.empty() && f.persistent.empty() && global_difference > tol;
  return f;
}

// ---- the trainer's replay -----------------------------------------------------------------------

namespace {

std::vector<Contribution> contributions_of(const torch::Tensor& parts) {  // (n, 2)
  const auto host = parts.to(torch::kCPU, torch::kFloat64).contiguous();
  std::vector<Contribution> out;
  for (int64_t r = 0; r < host.size(0); ++r)
    out.push_back({host[r][0].item<double>(), host[r][1].item<double>()});
  return out;
}

nlohmann::json to_json(const std::vector<Contribution>& parts) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : parts) {
    const auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nullptr; };
    out.push_back({{"loss_sum", num(p.loss_sum)}, {"grad_square", num(p.grad_square)}});
  }
  return out;
}

std::string host_of(const std::string& host_device) {
  return host_device.substr(0, host_device.find(' '));
}

// "rank 1 (node7 cuda:1)", "ranks 0 (...) and 1 (...)".
std::string ranks_named(const std::vector<int64_t>& ranks, const std::vector<std::string>& hosts) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    out += fmt::format("{}{} ({})",
                       i == 0                  ? ""
                       : i + 1 == ranks.size() ? " and "
                                               : ", ",
                       ranks[i], hosts.at(ranks[i]));
  return out;
}

// Sets the check's replaying flag for a scope (the faults that strike once stay away).
class Replaying {
 public:
  explicit Replaying(ReplayCheck& check) : check_(check) { check_.set_replaying(true); }
  ~Replaying() { check_.set_replaying(false); }

 private:
  ReplayCheck& check_;
};

}  // namespace

bool Trainer::State::replay_due(const HostFigures& h) const {
  if (!guard || h.contributions.empty()) return false;
  // fp16's overflow is the loss scale's business; replicas that disagree have their own rule.
  if (!defence.replay.enabled() || h.overflow || !guard::replicas_agree(h.rank_grad_norms))
    return false;
  const auto kept = static_cast<double>(std::count(h.kept.begin(), h.kept.end(), true));
  return guard::refuses_update(guard->pause_levels(counters.step), h.loss, h.grad_norm, 0.0, kept);
}

// The step's micro-batches forward and backward again on the weights and random state it began
// with, those of rank r-`shift` on rank r, then measured as the step was.
StepResult Trainer::State::replay_step(const StepResult& r, int64_t shift) {
  Replaying replaying(defence.replay);
  const StepSamples& own = r.samples;
  const int64_t accum = static_cast<int64_t>(own.tokens.size());
  const int64_t batch = own.tokens.front().size(0);
  std::vector<torch::Tensor> tokens = own.tokens, ids = own.ids;
  torch::Tensor fingerprints = torch::tensor(own.fingerprints, torch::kInt64);
  if (shift != 0) {  // every rank's micro-batches, then rank r-shift's
    const int64_t world = comm.world_size();
    const int64_t from = (comm.rank() - shift % world + world) % world;
    const auto all_tokens = comm.all_gather(torch::stack(own.tokens).to(device));
    const auto all_ids = comm.all_gather(torch::stack(own.ids).to(device, torch::kInt64));
    fingerprints = comm.all_gather(fingerprints.to(device)).to(torch::kCPU);
    for (int64_t m = 0; m < accum; ++m) {
      tokens[m] = all_tokens[from * accum + m];
      ids[m] = all_ids[from * accum + m];
    }
    fingerprints = fingerprints.narrow(0, from * accum * batch, accum * batch).contiguous();
  }
  parallel->optimizer().zero_grad();
  model->train();
  const double growth = launch.faults->gradient_growth(counters.iteration);
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor loss_sum = torch::zeros({}, fp32), kept = torch::zeros({}, fp32);
  StepSamples computed;
  for (int64_t m = 0; m < accum; ++m) {
    data::Batch b;
    b.tokens = tokens[m];
    b.sample_ids = ids[m];
    const int64_t* fp = fingerprints.data_ptr<int64_t>() + m * batch;
    defence.replay.restore_rng(device, m);
    const MicroOutput out = run_micro(b, m, std::vector<int64_t>(fp, fp + batch),
                                      r.screen_threshold, r.low_threshold, growth);
    loss_sum += out.loss_sum;
    kept += out.kept;
    parallel->after_backward(m, accum);
    computed.losses.push_back(out.per_sample_loss);
    if (r.screen_threshold) computed.keep.push_back(out.keep);
  }
  launch.faults->after_backward(counters.iteration, parallel->gradients_after_backward(),
                                /*replay=*/true);
  StepResult replayed = measure({torch::stack({loss_sum, kept}), computed, 0.0, 0.0},
                                r.screen_threshold, r.low_threshold);
  // The samples are this rank's own again: its ids and windows, the losses its data got on the
  // rank that replayed it.
  StepSamples samples = own;
  if (shift != 0) {
    const int64_t world = comm.world_size();
    const int64_t by = (comm.rank() + shift) % world;
    const auto pick = [&](const std::vector<torch::Tensor>& parts) {
      const auto all = comm.all_gather(torch::cat(parts).to(device));
      return all.narrow(0, by * accum * batch, accum * batch).split(batch);
    };
    samples.losses = pick(computed.losses);
    if (r.screen_threshold) samples.keep = pick(computed.keep);
  } else {
    samples.losses = computed.losses;
    samples.keep = computed.keep;
  }
  replayed.samples = std::move(samples);
  return replayed;
}

// Every rank's part of the step and its reduced values (loss, global norm): (world, 4) on the host.
torch::Tensor Trainer::State::parts_of_step(const StepResult& r) {
  const auto mine =
      torch::cat({r.contribution, torch::stack({r.loss.reshape({}).to(torch::kFloat64),
                                                r.grad_norm.reshape({}).to(torch::kFloat64)})});
  return comm.all_gather(mine).reshape({comm.world_size(), 4}).to(torch::kCPU).contiguous();
}

// This start's first guarded step, computed again before anything is queued behind it: the
// largest relative difference is the run's own noise, what a replay's tolerance rests on.
void Trainer::State::calibrate_replay(const StepResult& r) {
  const auto start = Clock::now();
  const int64_t world = comm.world_size(), shift = world > 1 ? 1 : 0;
  const torch::Tensor step = parts_of_step(r);
  const torch::Tensor replayed = parts_of_step(replay_step(r, shift));
  double noise =
      ReplayCheck::difference({step[0][2].item<double>(), step[0][3].item<double>()},
                              {replayed[0][2].item<double>(), replayed[0][3].item<double>()});
  for (double d : ReplayCheck::differences(contributions_of(step.slice(1, 0, 2)),
                                           contributions_of(replayed.slice(1, 0, 2)), shift))
    noise = std::max(noise, d);
  defence.replay.calibrate(noise);
  if (!comm.is_main()) return;
  if (!defence.replay.enabled()) {
    log::warn("replay",
              "step {} computed again differs by {:.3g} (relative): this run is too noisy for a "
              "replay to tell a device that computed wrong from its own noise; an alarm blames "
              "the data as before",
              counters.step + 1, noise);
    return;
  }
  log::info("replay",
            "step {} computed again{} {}: an alarm's step is computed again before its data is "
            "blamed, and parts that differ by more than {:.3g} are a machine fault ({:.3f} s a "
            "replay)",
            counters.step + 1, world > 1 ? " one rank on" : "",
            noise == 0 ? "matches bit for bit" : fmt::format("differs by {:.3g}", noise),
            defence.replay.tolerance(), seconds_since(start));
}

ReplayOutcome Trainer::State::replay_before_blame(const StepResult& r, const HostFigures& h) {
  const auto start = Clock::now();
  const int64_t world = comm.world_size(), shift = world > 1 ? 1 : 0;
  StepResult replayed = replay_step(r, shift);
  const torch::Tensor all = parts_of_step(replayed);
  const std::vector<Contribution> parts = contributions_of(all.slice(1, 0, 2));
  const double global = ReplayCheck::difference(
      {h.loss, h.grad_norm}, {all[0][2].item<double>(), all[0][3].item<double>()});
  const std::vector<double> diffs = ReplayCheck::differences(h.contributions, parts, shift);
  ReplayOutcome outcome;
  outcome.seconds = seconds_since(start);
  const ReplayCheck::Finding found = defence.replay.judge(diffs, h.contributions, shift, global);
  if (!found.machine_fault()) return outcome;  // the data's (or the model's): judged as before
  std::vector<int64_t> ranks = found.persistent;
  ranks.insert(ranks.end(), found.transient.begin(), found.transient.end());
  nlohmann::json detail = {{"cause", found.persistent.empty() ? "not_reproduced" : "persistent"},
                           {"hosts", launch.rank_hosts},  // every rank's, as ranks index them
                           {"parts", to_json(h.contributions)},
                           {"replayed", to_json(parts)},
                           {"replayed_on", shift == 0 ? "the same rank" : "the next rank"},
                           {"differences", diffs},
                           {"global_difference", global},
                           {"tolerance", defence.replay.tolerance()},
                           {"noise", defence.replay.noise()},
                           {"seconds", *outcome.seconds}};
  const std::string what =
      !found.persistent.empty()
          ? fmt::format(
                "{} computed its part of the step wrong, and in the replay another rank's "
                "part too, while its own data computes right on another rank: a device "
                "that computes wrong every time",
                ranks_named(found.persistent, launch.rank_hosts))
      : found.transient.empty()
          ? fmt::format(
                "the step's reduced values did not come back when it was computed again "
                "(relative difference {:.3g}), though every rank's own part did: a fault "
                "in the reduction. The step goes on with the replay's values; its data is "
                "not blamed",
                global)
          : fmt::format(
                "the step's alarm did not come back when it was computed again: {} "
                "computed a wrong result once. The step goes on with the replay's values; "
                "its data is not blamed",
                ranks_named(found.transient, launch.rank_hosts));
  const guard::Decision d =
      guard->device_fault(counters.iteration, ranks, !found.persistent.empty(), detail, what);
  if (d.action == guard::Action::kAbort) stop_faulty_device(d, /*in_step=*/true);
  record_events(d);
  outcome.redo = std::move(replayed);
  return outcome;
}

// stability.replica_check_every: the ranks that should hold the same weights (and optimizer state)
// compare a fingerprint of them. Ranks outside the majority (every rank, without one) have a
// device whose memory or update went wrong: a hardware_fault names them, and every rank restores
// the newest checkpoint (saved when they agreed), its data replayed. Returns whether they agreed.
bool Trainer::State::replicas_hold_the_same() {
  const torch::Tensor mine = parallel->replica_fingerprint();
  if (comm.world_size() == 1 || !mine.defined()) return true;
  const auto all = comm.all_gather(mine.reshape({-1}))
                       .reshape({comm.world_size(), -1})
                       .to(torch::kCPU, torch::kFloat64)
                       .contiguous();
  std::vector<uint64_t> hashes;
  std::map<uint64_t, int64_t> holders;
  for (int64_t r = 0; r < all.size(0); ++r) {
    hashes.push_back(XXH3_64bits(all[r].data_ptr<double>(), all.size(1) * sizeof(double)));
    ++holders[hashes.back()];
  }
  if (holders.size() == 1) return true;
  std::vector<int64_t> odd, named;
  for (const auto& [hash, n] : holders)
    if (2 * n > all.size(0))
      for (int64_t r = 0; r < all.size(0); ++r)
        if (hashes[r] != hash) named.push_back(r);
  for (int64_t r = 0; r < all.size(0); ++r) odd.push_back(r);
  if (!named.empty()) odd = named;
  nlohmann::json prints = nlohmann::json::array();
  for (uint64_t h : hashes) prints.push_back(fmt::format("{:016x}", h));
  const std::string what = fmt::format(
      "the ranks' copies of the weights should be equal and are not ({}): {}; every rank "
      "restores the newest checkpoint, whose data is replayed (not blamed)",
      prints.dump(),
      named.empty() ? "no majority names the rank whose memory went wrong"
                    : ranks_named(named, launch.rank_hosts) + " differ from the others");
  nlohmann::json detail = {{"cause", "replicas_diverged"},
                           {"hosts", launch.rank_hosts},
                           {"fingerprints", prints},
                           {"named", named}};
  const auto restore = [&] {
    const std::string path = defence.recovery->restore_replicas();
    if (comm.is_main())
      log::warn("replicas", "restored {} on every rank: training goes on from step {}", path,
                counters.step);
  };
  if (!guard) {
    detail["ranks"] = named;
    event(guard::GuardEvent{EventKind::kHardwareFault, detail, what});
    restore();
    return false;
  }
  const guard::Decision d =
      guard->device_fault(counters.iteration, odd, /*persistent=*/false, detail, what);
  if (d.action != guard::Action::kAbort) record_events(d);
  restore();  // before a faulty device's stop saves the weights
  if (d.action == guard::Action::kAbort) stop_faulty_device(d, /*in_step=*/false);
  return false;
}

// A device computes wrong: the last applied step (which no faulty device touched) is saved, the
// faulty ranks' hosts are added to exclude_hosts (which scripts/slurm/train.sbatch leaves out of
// its requeue), and the run stops with kExitFaultyDevice. The step in progress is the device's
// fault, not its data's: the checkpoint holds the data position it began at, so that the resumed
// run trains on it (as a run on sound devices would have).
void Trainer::State::stop_faulty_device(const guard::Decision& d, bool in_step) {
  record_events(d);
  save_checkpoint(/*stable=*/false, /*redo_step=*/in_step);
  std::set<std::string> hosts;
  for (int64_t rank : d.faulty_ranks) hosts.insert(host_of(launch.rank_hosts.at(rank)));
  if (comm.is_main()) {
    std::ofstream out(fs::path(launch.run_dir) / "exclude_hosts", std::ios::app);
    for (const auto& host : hosts) out << host << "\n";
  }
  for (const auto& e : d.events)
    if (e.kind == EventKind::kAbort) event(e);
  record.progress->finish();
  throw FaultyDevice(fmt::format(
      "{}; host {}. The last applied step is saved (step {}); resume on other hosts with "
      "--resume latest (scripts/slurm/train.sbatch requeues the job without the hosts listed in "
      "{}/exclude_hosts)",
      d.stop_message, fmt::join(hosts, ", "), counters.step, launch.run_dir));
}

}  // namespace keel::train
