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

// Sample ids of the validation stream live far above any training id, so the two never overlap.
constexpr int64_t kValidationIdBase = int64_t{1} << 48;
// Sequences in the reference batch the guard's diagnosis measures the model on.
constexpr int64_t kProbeSequences = 8;

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// A signal reaches the ranks at different steps; they stop together, at the first step any of them
// saw it, or the ones still training would wait on a collective the stopped ones never join.
int agreed_stop_signal(dist::Communicator& comm, const torch::Device& device) {
  const int sig = g_stop_signal.load();
  if (!comm.is_process_group()) return sig;
  std::vector<torch::Tensor> t{
      torch::tensor({static_cast<int64_t>(sig)}, torch::kInt64).to(device)};
  comm.all_reduce_max_(t);
  return static_cast<int>(t[0].item<int64_t>());
}

std::unique_ptr<data::BatchSource> make_source(const config::Config& cfg, int rank, int world,
                                               bool validation) {
  if (cfg.data.source == config::DataSource::kSynthetic) {
    data::SyntheticChain chain(cfg.model.vocab_size, cfg.data.synthetic_branching,
                               cfg.data.synthetic_zipf, static_cast<uint64_t>(cfg.run.seed));
    return std::make_unique<data::SyntheticSource>(std::move(chain), cfg.data.micro_batch_size,
                                                   cfg.model.seq_len, rank, world,
                                                   validation ? kValidationIdBase : 0);
  }
  return data::make_shard_source(cfg, rank, world, validation);
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

config::Config Trainer::State::resolved_config(const config::Config& c) {
  std::optional<int64_t> data_vocab;
  if (c.model.vocab_size == config::kAuto && c.data.source == config::DataSource::kShards)
    data_vocab = data::shard_vocab_size(c.data.path);
  return config::resolve_auto(c, data_vocab);
}

torch::Device select_device(config::Device requested, int local_rank) {
  if (requested == config::Device::kCpu) return torch::kCPU;
  const bool has_cuda = torch::cuda::is_available();
  if (requested == config::Device::kCuda && !has_cuda)
    throw ConfigError("run.device: cuda requested but no CUDA device is visible; use auto or cpu");
  if (!has_cuda) return torch::kCPU;
  return torch::Device(torch::kCUDA,
                       static_cast<c10::DeviceIndex>(local_rank % torch::cuda::device_count()));
}

StopSignals::StopSignals(void (*handler)(int)) {
  std::signal(SIGTERM, handler);
  std::signal(SIGINT, handler);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, &previous_mask_);
  catcher_ = std::thread([this, stop] {  // the one thread of ours the signals may interrupt
    pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
  });
}

StopSignals::~StopSignals() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
  catcher_.join();
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

std::string resolve_run_dir(const config::Config& cfg, const TrainOptions& options) {
  if (!options.run_dir.empty()) return options.run_dir;
  return (fs::path(cfg.run.out_dir) / cfg.run.name).string();
}

ProcessSettings::ProcessSettings()
    : threads_(at::get_num_threads()),
      caching_allocator_(caching_host_allocator_installed()),
      cpu_matmul_(model::cpu_matmul()),
      deterministic_(at::globalContext().deterministicAlgorithms()) {
  sigaction(SIGTERM, nullptr, &sigterm_);
  sigaction(SIGINT, nullptr, &sigint_);
}

ProcessSettings::~ProcessSettings() {
  sigaction(SIGTERM, &sigterm_, nullptr);
  sigaction(SIGINT, &sigint_, nullptr);
  at::globalContext().setDeterministicAlgorithms(deterministic_, false);
  model::set_cpu_matmul(cpu_matmul_);
  if (caching_allocator_ && !caching_host_allocator_installed())
    install_caching_host_allocator(default_host_cache_limit());
  if (!caching_allocator_ && caching_host_allocator_installed()) restore_default_host_allocator();
  if (at::get_num_threads() != threads_) at::set_num_threads(threads_);
}

void Trainer::State::event(const std::string& kind, const nlohmann::json& detail) {
  monitor::JsonRecord rec;
  rec.add("step", counters.step).add("kind", kind).add("iteration", counters.iteration);
  if (!detail.empty()) rec.add("detail", detail);
  files.write_event(counters.step, kind, rec);
  // A warning only in events.jsonl is a warning nobody reads: the console gets it too.
  if (kind == "warn" && comm.is_main()) {
    if (progress) progress->finish();
    const auto message = detail.is_object() && detail.contains("message")
                             ? detail["message"].get<std::string>()
                             : detail.dump();
    log::warn("guard", "step {}: {}", counters.step, message);
  }
}

void Trainer::State::record_events(const guard::Decision& d) {
  for (const auto& e : d.events)
    if (e.kind != "pause" && e.kind != "abort") event(e.kind, e.detail);
}

// The guard decided the run cannot go on: the abort goes on record first, then the run stops.
void Trainer::State::stop(const guard::Decision& d) {
  record_events(d);
  for (const auto& e : d.events)
    if (e.kind == "abort") event("abort", e.detail);
  progress->finish();
  throw RunStopped(d.stop_message);
}

namespace {

// A fresh start (no --resume) in a directory that holds an earlier run: that run's record and
// checkpoints move to RUN_DIR/previous/<UTC time>/, so the new record starts empty instead of
// interleaving with the old one, and nothing of the old run is lost.
void set_earlier_run_aside(const fs::path& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir / "metrics.jsonl", ec) && !fs::exists(run_dir / "checkpoints", ec) &&
      !fs::exists(run_dir / "events.jsonl", ec))
    return;
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H-%M-%SZ", &tm);
  fs::path aside = run_dir / "previous" / stamp;
  for (int i = 2; fs::exists(aside, ec); ++i)
    aside = run_dir / "previous" / (std::string(stamp) + "-" + std::to_string(i));
  fs::create_directories(aside, ec);
  if (ec) throw UserError("cannot create " + aside.string() + ": " + ec.message());
  // Only what keel writes moves: a file the user keeps in the directory stays where it is.
  static const char* const kRecord[] = {
      "config.resolved.yaml", "metrics.jsonl",    "events.jsonl", "eval.jsonl",
      "samples.jsonl",        "quarantine.jsonl", "starts.jsonl", "heartbeat",
      "checkpoints",          "forensics",        "tensorboard",  "report.html"};
  for (const char* name : kRecord) {
    const fs::path entry = run_dir / name;
    if (!fs::exists(fs::symlink_status(entry, ec))) continue;
    fs::rename(entry, aside / name, ec);
    if (ec)
      throw UserError("cannot move " + entry.string() + " aside to " + aside.string() + ": " +
                      ec.message() + "; HINT: pass --resume latest to continue that run, " +
                      "or a new --run-dir");
  }
  log::warn("train",
            "{} held an earlier run; it is moved to {} (pass --resume latest to continue a run "
            "instead of starting again)",
            run_dir.string(), aside.string());
}

}  // namespace

void Trainer::State::setup() {
  run_dir = resolve_run_dir(cfg, options);
  if (comm.is_main()) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) throw UserError("cannot create run directory " + run_dir + ": " + ec.message());
    if (options.resume.empty()) set_earlier_run_aside(run_dir);
    monitor::write_record_file((fs::path(run_dir) / "config.resolved.yaml").string(),
                               resolved_yaml);
  }
  comm.barrier();
  files =
      monitor::RunFiles::open(run_dir, comm.is_main(), cfg.logging.sample_ids,
                              cfg.logging.tensorboard ? cfg.logging.tensorboard_every_steps : 0);
  if (comm.is_main()) history = RunHistory(run_dir, options.resume);
  progress = std::make_unique<monitor::Progress>(cfg.logging.progress, comm.is_main());

  process_settings = std::make_unique<ProcessSettings>();
  stop_signals = std::make_unique<StopSignals>(on_stop_signal);
  if (cfg.run.threads > 0) at::set_num_threads(static_cast<int>(cfg.run.threads));
  if (cfg.run.host_allocator == config::HostAllocator::kCaching) {
    install_caching_host_allocator(default_host_cache_limit());
  } else {
    restore_default_host_allocator();
  }
  // Without oneDNN in this LibTorch, model::linear stays on ATen whatever the choice.
  model::set_cpu_matmul(cfg.run.cpu_matmul);
  if (cfg.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));

  device = select_device(cfg.run.device, options.local_rank);
  if (device.is_cuda()) c10::cuda::set_device(device.index());
  if (comm.world_size() > 1 && cfg.checkpoint.async)
    throw ConfigError(
        "checkpoint.async with several ranks: the writer thread's barrier would race the "
        "training collectives (an out-of-band store barrier is not built yet); set it to false");
  precision = cfg.run.precision;
  model = model::Transformer(cfg.model);
  if (!options.init_from.empty()) {
    const auto weights = checkpoint::read_hf_model(options.init_from, cfg.model);
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) item.value().copy_(weights.at(item.key()));
    log::info("model", "initial weights from {} (--init-from){}", options.init_from,
              options.resume.empty() ? "" : "; a checkpoint to resume from replaces them");
  }
  model->to(device);  // parameters stay fp32: the master weights; autocast lowers the compute

  for (auto& item : model->named_parameters()) {
    named_params.emplace_back(item.key(), item.value());
    params.push_back(item.value());
  }
  // ZeRO-1 reduce-scatters the gradient buckets, so its reducer exists whether or not the buckets
  // overlap the backward pass; without ZeRO, overlap: false is one flat all-reduce instead.
  const bool zero = cfg.distributed.zero == 1;
  if (comm.is_process_group() && (zero || cfg.distributed.overlap))
    reducer = std::make_unique<dist::GradReducer>(comm, params, cfg.distributed.bucket_mb, zero);
  if (zero) {
    auto sharded =
        std::make_unique<dist::ZeroOptimizer>(named_params, cfg.optim, comm, reducer.get());
    zero_optimizer = sharded.get();
    optimizer = std::move(sharded);
  } else {
    optimizer = optim::make_optimizer(optim::make_param_groups(named_params, cfg.optim), cfg.optim);
  }
  if (precision == optim::Precision::kFp16)
    scaler.emplace(device, cfg.run.fp16_initial_scale, /*growth_factor=*/2.0,
                   /*backoff_factor=*/0.5, cfg.run.fp16_growth_interval);
  layers = std::make_unique<LayerGroups>(named_params, device);

  const int rank = comm.rank(), world = comm.world_size();
  train_data = make_source(cfg, rank, world, /*validation=*/false);
  val_data = make_source(cfg, rank, world, /*validation=*/true);
  val_start = val_data->state();
  probe_tokens = val_data->next().tokens;
  probe_tokens =
      probe_tokens.slice(0, 0, std::min<int64_t>(kProbeSequences, probe_tokens.size(0))).clone();
  if (auto* synthetic = dynamic_cast<data::SyntheticSource*>(train_data.get()))
    loss_floor = synthetic->chain().entropy_rate();
  faults =
      std::make_unique<FaultInjector>(faults_for_rank(cfg.faults, rank), cfg.data.grad_accum_steps,
                                      cfg.model.vocab_size, cfg.run.seed + rank);
  samples_per_step = cfg.data.micro_batch_size * cfg.data.grad_accum_steps * world;
  tokens_per_step = samples_per_step * cfg.model.seq_len;
  if (cfg.stability.enabled)
    guard = std::make_unique<guard::Guard>(cfg.stability, layers->names(),
                                           schedule::warmup_steps(cfg.schedule, cfg.run.max_steps),
                                           samples_per_step, cfg.run.max_steps);
  if (cfg.checkpoint.every_steps != config::kAuto) {
    checkpoint_every = cfg.checkpoint.every_steps;
    stable_every = checkpoint::stable_interval(cfg.checkpoint, checkpoint_every);
    stable_window = checkpoint::stable_window(cfg.checkpoint, checkpoint_every);
    cadence_decided = true;
  }
  grad_norm_window = std::make_unique<monitor::DeviceWindow>(cfg.stability.median_window, device);

  checkpointer = std::make_unique<checkpoint::Checkpointer>(
      config::checkpoint_dir(cfg, run_dir), cfg.checkpoint, rank, world, KEEL_VERSION,
      checkpoint::xxh3_hex_of(resolved_yaml), [this] { comm.barrier(); });

  log::info("train", "run directory {}", run_dir);
  log::info("model", "{} with {:.2f}M parameters, {:.2f} MFLOPs/token, on {} in {}",
            config::name_of(cfg.model.arch), model->num_parameters() / 1e6,
            model->flops_per_token() / 1e6, device.str(), config::name_of(cfg.run.precision));
  log::info("optim", "{} lr {} (schedule {}, warmup {}), global batch {} sequences = {} tokens",
            optimizer->describe(), cfg.optim.lr, config::name_of(cfg.schedule.kind),
            schedule::warmup_steps(cfg.schedule, cfg.run.max_steps), samples_per_step,
            tokens_per_step);
  if (loss_floor)
    log::info("data", "synthetic chain: entropy rate {:.4f} nats/token is the loss floor",
              *loss_floor);
  if (!cfg.faults.empty())
    log::warn("faults", "{} fault(s) will be injected (a rehearsal, not a production run)",
              cfg.faults.size());

  event("run_start", {{"world_size", world},
                      {"device", device.str()},
                      {"parameters", model->num_parameters()},
                      {"flops_per_token", model->flops_per_token()},
                      {"resume", options.resume}});
}

// ---- the step ---------------------------------------------------------------------------------
// One optimizer step, top to bottom: the micro-batches' forward and backward (screened: samples
// far above the per-sample baseline are masked out of the loss), the fault hook, the measurements
// (one host read when the guard is on), the guard's decision, then the update and its record — or
// a skip or a rollback instead of the update.
void Trainer::State::train_step() {
  const double lr = effective_lr(cfg, counters.step, counters.iteration, guard.get(), faults.get());
  const bool log_step = is_log_step();
  model->set_record_activation_stats(log_step && guard);
  const std::optional<double> threshold =
      guard ? guard->screen_threshold(counters.step) : std::nullopt;

  torch::Tensor sums = forward_backward(/*keep_samples=*/guard != nullptr, threshold);
  faults->after_backward(counters.iteration, params);
  const StepResult result = measure(std::move(sums), threshold);
  const Verdict verdict = decide(result, lr);
  if (verdict.action() != guard::Action::kApply) {
    reject(verdict, result);
    return;
  }
  const std::vector<double> update_ratios = apply_update(result, lr, log_step);
  if (log_step) {
    record_step(result, lr, update_ratios);
    check_consumed();
  }
}

bool Trainer::State::is_log_step() const {
  const int64_t next = counters.step + 1;
  return next % std::max<int64_t>(cfg.logging.every_steps, 1) == 0 || next == cfg.run.max_steps ||
         counters.step == 0;
}

data::Batch Trainer::State::next_batch() {
  const auto wait_start = Clock::now();
  data::Batch batch = train_data->next();
  window.loader_wait_s += seconds_since(wait_start);
  faults->corrupt(batch, counters.micro_taken);  // corrupt_batch is keyed to the data position
  ++counters.micro_taken;
  return batch;
}

// Runs grad_accum_steps micro-batches forward and backward; their gradients sum in .grad. With a
// screen threshold, samples whose loss is above it (not NaN ones: those are the guard's) weigh 0,
// the rest 1/B each. Returns (2) on the device: the kept samples' summed cross-entropy and their
// count.
torch::Tensor Trainer::State::forward_backward(bool keep_samples,
                                               std::optional<double> screen_threshold) {
  const int64_t accum = cfg.data.grad_accum_steps;
  model->train();
  step_samples.clear();
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor loss_sum = torch::zeros({}, fp32), kept = torch::zeros({}, fp32);
  std::vector<int64_t> sample_ids;                // logging.sample_ids: this step's data, in order
  const int64_t position = counters.micro_taken;  // of its first micro-batch in the data order
  for (int64_t micro = 0; micro < accum; ++micro) {
    data::Batch batch = next_batch();
    if (cfg.logging.sample_ids) {
      const auto ids = batch.sample_ids.to(torch::kCPU, torch::kInt64).contiguous();
      sample_ids.insert(sample_ids.end(), ids.data_ptr<int64_t>(),
                        ids.data_ptr<int64_t>() + ids.numel());
    }
    auto tokens = batch.tokens.to(device, /*non_blocking=*/true);  // (B, T+1)
    model::LossOutput out;
    {
      optim::AutocastScope autocast(device.type(), precision);
      out = model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1));
    }
    // Each micro-batch contributes 1/accum of the step's mean loss, so the summed gradient equals
    // the gradient of one batch accum times larger.
    torch::Tensor objective = out.loss, keep;
    const auto samples = static_cast<double>(out.per_sample_loss.numel());
    loss_sum += out.ce_loss * samples;
    kept += samples;
    if (screen_threshold) {
      keep = out.per_sample_loss.le(*screen_threshold)
                 .logical_or(out.per_sample_loss.isnan())
                 .to(torch::kFloat32);  // (B)
      // The masked samples' share taken back out: x - 0 is x, so a step that masks nothing
      // computes exactly what an unscreened step does, bit for bit.
      const auto masked = 1.0 - keep;
      objective = objective - (out.per_sample_objective * masked).mean();
      loss_sum -= (out.per_sample_loss * masked).sum();
      kept -= masked.sum();
    }
    torch::Tensor scaled = objective / static_cast<double>(accum);
    if (scaler) scaled = scaled * scaler->scale();
    // Only the step's last backward communicates; its buckets start as they fill (after it, when
    // a fault is to change the gradients, or with overlap off).
    if (reducer && micro == accum - 1) {
      const bool start_in_backward =
          cfg.distributed.overlap && !faults->touches_gradients(counters.iteration);
      if (start_in_backward || reducer->sharded()) reducer->arm(start_in_backward);
    }
    scaled.backward();
    if (keep_samples) {
      step_samples.ids.push_back(batch.sample_ids);
      step_samples.losses.push_back(out.per_sample_loss);
      step_samples.tokens.push_back(batch.tokens);
      if (keep.defined()) step_samples.keep.push_back(keep);
      if (batch.doc_lengths.defined()) step_samples.doc_lengths.push_back(batch.doc_lengths);
      if (batch.buckets.defined()) step_samples.buckets.push_back(batch.buckets);
    }
  }
  if (cfg.logging.sample_ids) {
    if (comm.world_size() > 1) {  // every rank's part of the step, in rank order
      const auto all = comm.all_gather(torch::tensor(sample_ids, torch::kInt64).to(device))
                           .to(torch::kCPU)
                           .contiguous();
      sample_ids.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
    }
    files.samples.write(monitor::JsonRecord()
                            .add("step", counters.step + 1)
                            .add("iteration", counters.iteration)
                            .add("position", position)
                            .add("ids", nlohmann::json(sample_ids)));
  }
  return torch::stack({loss_sum, kept});
}

// Averages across ranks, unscales (fp16), and takes the norms: one pass over the gradients gives
// the per-parameter norms (the guard's layer norms) and from them the global norm. A screened
// step's gradients are a sum over the kept samples of 1/samples each: grad_scale makes that a
// mean over the kept ones (folded into clipping, so no extra pass over the gradients).
StepResult Trainer::State::measure(torch::Tensor sums, std::optional<double> screen_threshold) {
  StepResult r;
  if (comm.is_process_group()) {
    const auto comm_start = Clock::now();  // what the backward pass did not hide
    // Gradients averaged over the ranks (an overflow anywhere is then an overflow everywhere);
    // the kept samples' losses and counts summed.
    if (reducer && reducer->armed()) {
      reducer->finish();
      if (!reducer_reported && comm.is_main()) {  // once: did the overlap happen?
        reducer_reported = true;
        log::info("dist", "gradients {} in {} buckets; {} of them started during the backward pass",
                  reducer->sharded() ? "reduce-scattered" : "all-reduced", reducer->buckets(),
                  reducer->started_in_backward());
      }
    } else {
      std::vector<torch::Tensor> grads;
      for (auto& p : params)
        if (p.grad().defined()) grads.push_back(p.grad());
      comm.all_reduce_mean_(grads);
    }
    std::vector<torch::Tensor> totals{sums};
    comm.all_reduce_sum_(totals);
    window.comm_s += seconds_since(comm_start);
  }
  // ZeRO-1: this rank holds the reduced gradient of its own elements only; the norms are summed
  // over the ranks, and an overflow in any rank's part is an overflow for all.
  const std::vector<torch::Tensor>& grads =
      zero_optimizer ? zero_optimizer->attach_grads() : params;
  if (scaler) {
    r.found_inf = scaler->unscale_(grads);
    if (zero_optimizer && comm.is_process_group()) {
      std::vector<torch::Tensor> flag{*r.found_inf};
      comm.all_reduce_max_(flag);
      r.found_inf = flag[0];
    }
  }
  r.loss = sums[0] / sums[1].clamp_min(1.0);  // the mean over every rank's kept samples
  r.param_norms =
      zero_optimizer ? zero_optimizer->param_grad_norms() : optim::per_param_grad_norms(params);
  r.screen_threshold = screen_threshold;
  if (screen_threshold) {
    // The gradients are a sum over the kept samples of 1/samples each; this makes them a mean.
    r.grad_scale = (static_cast<double>(samples_per_step) / sums[1].clamp_min(1.0)).reshape({});
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

// One small host read per step, so the guard decides before the update touches the weights: the
// loss, the norms, the fp16 overflow flag and the step's per-sample losses and screen flags.
// Without the guard every step is applied (a non-finite gradient is still refused on the device).
Verdict Trainer::State::decide(const StepResult& r, double lr) {
  Verdict v;
  if (!guard) return v;
  const auto start = Clock::now();
  const auto dev = r.loss.options();
  std::vector<torch::Tensor> parts = {
      r.loss.reshape({1}), r.grad_norm.reshape({1}),
      r.found_inf ? r.found_inf->reshape({1}).to(dev) : torch::zeros({1}, dev),
      layers->reduce(r.param_norms)};
  // Every rank's per-sample losses and screen flags, so that every rank feeds its guard the same
  // values and takes the same decision.
  const auto losses = comm.all_gather(torch::cat(step_samples.losses).to(dev));
  parts.push_back(losses);
  if (r.screen_threshold) parts.push_back(comm.all_gather(torch::cat(step_samples.keep).to(dev)));
  auto packed = torch::cat(parts).to(torch::kCPU, torch::kFloat64);
  const double* p = packed.data_ptr<double>();
  const int64_t n_layers = static_cast<int64_t>(layers->names().size());
  const int64_t n = losses.numel();
  const double* sample_loss = p + 3 + n_layers;
  const double* keep = r.screen_threshold ? sample_loss + n : nullptr;

  guard::StepSignals s;
  s.step = counters.step;
  s.iteration = counters.iteration;
  s.loss = p[0];
  s.grad_norm = p[1];
  s.overflow = p[2] > 0;
  s.layer_grad_norms.assign(p + 3, p + 3 + n_layers);
  s.clipped = s.grad_norm > r.clip_bound;
  if (scaler) s.loss_scale = scaler->scale().item<double>();
  s.samples = n;
  s.screen_threshold = r.screen_threshold;
  const auto ids = comm.all_gather(torch::cat(step_samples.ids).to(device, torch::kInt64))
                       .to(torch::kCPU)
                       .contiguous();
  host_samples = HostSamples();
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = !keep || keep[i] > 0.5;
    host_samples.ids.push_back(ids.data_ptr<int64_t>()[i]);
    host_samples.losses.push_back(sample_loss[i]);
    host_samples.kept.push_back(kept);
    (kept ? s.kept_losses : s.masked_losses).push_back(sample_loss[i]);
    host_samples.masked += !kept;
  }
  last_layer_grad_norms = s.layer_grad_norms;
  v.decision = guard->observe(s);
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
  if (v.action() == guard::Action::kApply && s.clipped) ++window.clipped;
  window.masked += host_samples.masked;
  quarantine_screened(v.decision);
  window.guard_s += seconds_since(start);
  if (v.action() == guard::Action::kAbort) stop(v.decision);
  record_events(v.decision);
  return v;
}

void Trainer::State::quarantine(int64_t id, const std::string& reason, std::optional<double> loss,
                                nlohmann::json extra) {
  if (!quarantined_since_stable.insert(id).second) return;  // on record already
  monitor::JsonRecord rec;
  rec.add("id", id).add("step", counters.step).add("iteration", counters.iteration);
  rec.add("reason", reason);
  if (loss) rec.add("loss", finite_or_null(*loss));
  const nlohmann::json where = train_data->locate(id);  // a named json: items() refers to it
  for (auto& [key, value] : where.items()) rec.add(key, value);
  for (auto& [key, value] : extra.items()) rec.add(key, value);
  files.quarantine.write(rec);
}

void Trainer::State::quarantine_screened(guard::Decision& d) {
  if (host_samples.masked == 0) return;
  std::vector<std::pair<double, int64_t>> masked;  // (loss, id), worst first
  for (size_t i = 0; i < host_samples.ids.size(); ++i)
    if (!host_samples.kept[i]) masked.emplace_back(host_samples.losses[i], host_samples.ids[i]);
  std::sort(masked.rbegin(), masked.rend());
  nlohmann::json named = nlohmann::json::array();
  for (const auto& [loss, id] : masked) {
    quarantine(id, "screen", loss);
    if (named.size() < static_cast<size_t>(std::max<int64_t>(cfg.stability.top_k_samples, 1)))
      named.push_back({{"id", id}, {"loss", loss}});
  }
  for (auto& e : d.events)
    if (e.kind == "screen" || e.detail.value("signal", "") == "screen")
      e.detail["top_samples"] = named;
}

// A step the guard did not apply: weights and optimizer state stay untouched, the data moves on.
void Trainer::State::reject(const Verdict& v, const StepResult& r) {
  if (scaler && r.found_inf) scaler->update(*r.found_inf);
  optimizer->zero_grad();
  ++counters.iteration;
  ++window.skipped;
  if (v.action() == guard::Action::kPause) pause_and_rollback(v);
  if (v.decision.skip_reason == "incident" || v.decision.skip_reason == "data") drop_step(v);
}

// Clips, steps the optimizer and counts the update. At log steps it returns the per-layer
// update/parameter ratios |Δw|/|w| (empty otherwise).
std::vector<double> Trainer::State::apply_update(const StepResult& r, double lr, bool log_step) {
  optim::clip_grad_norm_(zero_optimizer ? zero_optimizer->attach_grads() : params, r.clip_bound,
                         r.grad_norm, r.grad_scale);
  // A non-finite gradient never reaches the weights: the update is skipped on the device.
  torch::Tensor non_finite = r.grad_norm.isfinite().logical_not().to(torch::kFloat32).reshape({1});
  torch::Tensor found_inf = r.found_inf ? torch::maximum(*r.found_inf, non_finite) : non_finite;

  std::vector<torch::Tensor> before;
  if (log_step) before = torch::_foreach_mul(params, 1.0);  // snapshot for the update ratio
  optimizer->step(lr, found_inf);
  if (scaler) scaler->update(found_inf);
  optimizer->zero_grad();
  grad_norm_window->push(r.grad_norm);
  ++counters.step;
  ++counters.iteration;
  ++window.steps;
  if (guard)
    for (const auto& e : guard->after_update(counters.step)) event(e.kind, e.detail);
  if (!log_step) return {};

  auto delta_norms = torch::stack(torch::_foreach_norm(torch::_foreach_sub(params, before)));
  auto param_norms = torch::stack(torch::_foreach_norm(params));
  auto layer_ratio = layers->reduce(delta_norms) / layers->reduce(param_norms).clamp_min(1e-12);
  auto total = (delta_norms.norm() / param_norms.norm().clamp_min(1e-12)).reshape({1});
  auto host = torch::cat({total, layer_ratio}).to(torch::kCPU, torch::kFloat64);
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

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
    event("loader_wait", {{"wait_ms", loader.wait_ms}, {"waits", loader.waits}});

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
  event("abort", {{"reason", "consumed_mismatch"},
                  {"samples_served", served},
                  {"samples_expected", expected},
                  {"deviation", deviation}});
  throw RunStopped(fmt::format(
      "data-count mismatch at step {}: the loader took {} samples from the data order but the "
      "trainer consumed {} (deviation {:.1f} % > data.consumed_tolerance {:.1f} %)",
      counters.step, static_cast<int64_t>(served), static_cast<int64_t>(expected), deviation * 100,
      cfg.data.consumed_tolerance * 100));
}

double Trainer::State::probe_loss() {
  torch::NoGradGuard no_grad;
  model->eval();
  auto tokens = probe_tokens.to(device);  // (P, T+1)
  torch::Tensor loss;
  {
    optim::AutocastScope autocast(device.type(), precision);
    loss = model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1)).ce_loss;
  }
  model->train();
  std::vector<torch::Tensor> t{loss.reshape({1})};
  comm.all_reduce_mean_(t);
  return t[0].item<double>();
}

double Trainer::State::evaluate() {
  const auto eval_start = Clock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  // The same validation samples every time, so successive evaluations are comparable.
  val_data->load_state(val_start);
  torch::Tensor total =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  const int64_t batches = std::max<int64_t>(cfg.eval.batches, 1);
  for (int64_t i = 0; i < batches; ++i) {
    auto tokens = val_data->next().tokens.to(device);  // (B, T+1)
    optim::AutocastScope autocast(device.type(), precision);
    total += model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1)).ce_loss;
  }
  std::vector<torch::Tensor> t{total / static_cast<double>(batches)};
  comm.all_reduce_mean_(t);
  last_val_loss = t[0].item<double>();
  counters.last_eval_step = counters.step;
  model->train();

  monitor::JsonRecord rec;
  rec.add("step", counters.step).add("val_loss", last_val_loss);
  if (loss_floor) rec.add("floor", *loss_floor);
  files.write_eval(counters.step, rec);
  // Eval time is not training time: keep it out of the next tokens/s figure.
  window.start += std::chrono::duration_cast<Clock::duration>(Clock::now() - eval_start);
  progress->finish();
  if (loss_floor)
    log::info("eval", "step {}: val_loss {:.4f} (floor {:.4f}, gap {:.4f})", counters.step,
              last_val_loss, *loss_floor, last_val_loss - *loss_floor);
  else
    log::info("eval", "step {}: val_loss {:.4f}", counters.step, last_val_loss);
  return last_val_loss;
}

Trainer::Trainer(const config::Config& cfg, std::string resolved_yaml, TrainOptions options,
                 dist::Communicator& comm)
    : s_(std::make_unique<State>(cfg, std::move(resolved_yaml), std::move(options), comm)) {}

Trainer::~Trainer() = default;

void Trainer::run() {
  State& s = *s_;
  s.setup();
  // Every way out through keel's own exits goes on record in starts.jsonl; a crash (kill -9, a
  // segfault) leaves its start open, which the next start records as an abnormal end.
  try {
    loop();
    s.history.record_end(kExitOk, s.counters.step);
  } catch (const Interrupted& e) {
    s.history.record_end(e.exit_code(), s.counters.step);
    throw;
  } catch (const RecordError& e) {
    // The record is gone (disk full, run directory removed): keep what training achieved if the
    // checkpoint directory still takes it, then stop. The checkpoint's own events are not
    // written: that file is what failed.
    s.progress->finish();
    log::error("train", "{}", e.what());
    try {
      if (s.last_checkpoint_step != s.counters.step) {
        auto path = s.checkpointer->save(s.counters.step, s.capture(), /*stable=*/false);
        s.checkpointer->wait();
        log::error("train", "last checkpoint written to {}", path.string());
      }
    } catch (const std::exception& ce) {
      log::error("train", "the last checkpoint could not be written either: {}", ce.what());
    }
    throw;
  } catch (const RunStopped&) {
    s.history.record_end(kExitRunStopped, s.counters.step);
    throw;
  } catch (const UserError&) {
    s.history.record_end(kExitUserError, s.counters.step);
    throw;
  }
}

void Trainer::loop() {
  State& s = *s_;
  const auto& cfg = s.cfg;
  const int64_t eval_every = cfg.eval.every_steps;
  const auto start = Clock::now();
  if (!s.resume()) {
    s.evaluate();
    // A rollback needs a target from the very start: the initial weights are stable by definition.
    if (s.guard && cfg.stability.rollback.enabled) s.save_checkpoint(/*stable=*/true);
  }
  const auto beat = [&s] {
    s.history.beat({s.counters.step, s.counters.iteration, s.counters.micro_taken});
  };
  beat();
  while (s.counters.step < cfg.run.max_steps) {
    s.train_step();
    beat();
    const int64_t step = s.counters.step;
    const bool last = step == cfg.run.max_steps;
    const bool due = eval_every > 0 && step % eval_every == 0 && step != s.counters.last_eval_step;
    if (last || due) s.evaluate();
    s.maybe_checkpoint();
    if (int sig = agreed_stop_signal(s.comm, s.device); sig != 0 && !last) {
      s.progress->finish();
      log::warn("train", "signal {} at step {}: writing a checkpoint before exiting", sig, step);
      if (s.last_checkpoint_step != step) s.save_checkpoint(/*stable=*/false);
      s.checkpointer->wait();
      s.event("interrupted", {{"signal", sig}});
      throw Interrupted(sig);
    }
  }
  if (s.last_checkpoint_step != s.counters.step) s.save_checkpoint(/*stable=*/false);
  s.checkpointer->wait();
  s.progress->finish();
  const double elapsed = seconds_since(start);
  log::info("train", "done: {} steps in {}, final loss {:.4f}, val_loss {:.4f}", s.counters.step,
            monitor::format_duration(elapsed), s.last_loss, s.last_val_loss);
  s.event("run_end", {{"seconds", elapsed},
                      {"loss", s.last_loss},
                      {"val_loss", s.last_val_loss},
                      {"rollbacks", s.guard ? s.guard->rollbacks() : 0}});
}

double Trainer::last_loss() const { return s_->last_loss; }
double Trainer::last_val_loss() const { return s_->last_val_loss; }

}  // namespace keel::train
