#include "train/trainer.h"

#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/host_allocator.h"
#include "common/log.h"
#include "config/validate.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "model/fused_ops.h"
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

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

torch::Device select_device(const std::string& requested) {
  if (requested == "cpu") return torch::kCPU;
  bool has_cuda = torch::cuda::is_available();
  if (requested == "cuda") {
    if (!has_cuda)
      throw ConfigError(
          "run.device: cuda requested but no CUDA device is visible; use auto or cpu");
    return torch::kCUDA;
  }
  return has_cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
}

std::unique_ptr<data::BatchSource> make_source(const config::Config& cfg, int rank, int world,
                                               bool validation) {
  if (cfg.data.source == "synthetic") {
    data::SyntheticChain chain(cfg.model.vocab_size, cfg.data.synthetic_branching,
                               cfg.data.synthetic_zipf, static_cast<uint64_t>(cfg.run.seed));
    return std::make_unique<data::SyntheticSource>(std::move(chain), cfg.data.micro_batch_size,
                                                   cfg.model.seq_len, rank, world,
                                                   validation ? kValidationIdBase : 0);
  }
  return data::make_shard_source(cfg, rank, world, validation);
}

}  // namespace

std::string resolve_run_dir(const config::Config& cfg, const TrainOptions& options) {
  if (!options.run_dir.empty()) return options.run_dir;
  return (fs::path(cfg.run.out_dir) / cfg.run.name).string();
}

void Trainer::State::event(const std::string& kind, const nlohmann::json& detail) {
  monitor::JsonRecord rec;
  rec.add("step", step).add("kind", kind).add("iteration", iteration);
  if (!detail.empty()) rec.add("detail", detail);
  files.events.write(rec);
}

void Trainer::State::setup() {
  run_dir = resolve_run_dir(cfg, options);
  if (comm.is_main()) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) throw UserError("cannot create run directory " + run_dir + ": " + ec.message());
    std::ofstream(fs::path(run_dir) / "config.resolved.yaml") << resolved_yaml;
  }
  comm.barrier();
  files = monitor::RunFiles::open(run_dir, comm.is_main(), cfg.logging.sample_ids);
  progress = std::make_unique<monitor::Progress>(cfg.logging.progress, comm.is_main());

  if (cfg.run.threads > 0) at::set_num_threads(static_cast<int>(cfg.run.threads));
  if (cfg.run.host_allocator == "caching") {
    install_caching_host_allocator(default_host_cache_limit());
  } else {
    restore_default_host_allocator();
  }
  // Without oneDNN in this LibTorch, model::linear stays on ATen whatever the choice.
  model::set_cpu_matmul(cfg.run.cpu_matmul == "onednn" ? model::CpuMatmul::kOneDnn
                                                       : model::CpuMatmul::kAten);
  if (cfg.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));

  device = select_device(cfg.run.device);
  precision = optim::parse_precision(cfg.run.precision);
  model = model::Transformer(cfg.model);
  model->to(device);  // parameters stay fp32: the master weights; autocast lowers the compute

  for (auto& item : model->named_parameters()) {
    named_params.emplace_back(item.key(), item.value());
    params.push_back(item.value());
  }
  optimizer = optim::make_optimizer(optim::make_param_groups(named_params, cfg.optim), cfg.optim);
  if (precision == optim::Precision::kFp16) scaler.emplace(device);
  layers = std::make_unique<LayerGroups>(named_params, device);

  int rank = comm.rank(), world = comm.world_size();
  train_data = make_source(cfg, rank, world, /*validation=*/false);
  if (auto* synthetic = dynamic_cast<data::SyntheticSource*>(train_data.get()))
    loss_floor = synthetic->chain().entropy_rate();
  faults = std::make_unique<FaultInjector>(cfg.faults, cfg.data.grad_accum_steps,
                                           cfg.model.vocab_size, cfg.run.seed + rank);
  if (cfg.stability.enabled) guard = std::make_unique<guard::Guard>(cfg.stability, layers->names());

  samples_per_step = cfg.data.micro_batch_size * cfg.data.grad_accum_steps * world;
  tokens_per_step = samples_per_step * cfg.model.seq_len;
  grad_norm_window = std::make_unique<monitor::DeviceWindow>(cfg.stability.median_window, device);

  const std::string ckpt_dir = config::checkpoint_dir(cfg, run_dir).string();
  checkpointer = std::make_unique<checkpoint::Checkpointer>(
      ckpt_dir, cfg.checkpoint, rank, world, KEEL_VERSION,
      std::to_string(std::hash<std::string>{}(resolved_yaml)), [this] { comm.barrier(); });

  log::info("train", "run directory {}", run_dir);
  log::info("model", "{} with {:.2f}M parameters, {:.2f} MFLOPs/token, on {} in {}", cfg.model.arch,
            model->num_parameters() / 1e6, model->flops_per_token() / 1e6, device.str(),
            cfg.run.precision);
  log::info("optim", "{} lr {} (schedule {}, warmup {}), global batch {} sequences = {} tokens",
            optimizer->describe(), cfg.optim.lr, cfg.schedule.kind,
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
                      {"resume", options.resume}});
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

data::Batch Trainer::State::next_batch() {
  auto wait_start = Clock::now();
  data::Batch batch = train_data->next();
  loader_wait_s += seconds_since(wait_start);
  faults->corrupt(batch, micro_taken);
  ++micro_taken;
  return batch;
}

// The samples the loader took from the data order must match what the trainer asked for: a
// silent loss or repeat of data would otherwise go unnoticed for days.
void Trainer::State::check_consumed() {
  auto counts = torch::tensor({static_cast<double>(train_data->samples_served()),
                               static_cast<double>(micro_taken * cfg.data.micro_batch_size)},
                              torch::kFloat64);
  std::vector<torch::Tensor> t{counts.to(device)};
  comm.all_reduce_sum_(t);
  auto host = t[0].to(torch::kCPU);
  double served = host[0].item<double>(), expected = host[1].item<double>();
  double deviation = expected > 0 ? std::abs(served - expected) / expected : 0.0;
  if (deviation > cfg.data.consumed_tolerance) {
    nlohmann::json detail = {{"reason", "consumed_mismatch"},
                             {"samples_served", served},
                             {"samples_expected", expected},
                             {"deviation", deviation}};
    event("abort", detail);
    throw RunStopped(fmt::format(
        "data-count mismatch at step {}: the loader took {} samples from the data order but the "
        "trainer consumed {} (deviation {:.1f} % > data.consumed_tolerance {:.1f} %)",
        step, static_cast<int64_t>(served), static_cast<int64_t>(expected), deviation * 100,
        cfg.data.consumed_tolerance * 100));
  }
}

void Trainer::State::train_step() {
  const int64_t accum = cfg.data.grad_accum_steps;
  const double lr = effective_lr(cfg, step, iteration, guard.get(), faults.get());
  faults->maybe_crash(iteration);
  model->train();
  step_samples.clear();
  const bool is_log_step = (step + 1) % std::max<int64_t>(cfg.logging.every_steps, 1) == 0 ||
                           step + 1 == cfg.run.max_steps || step == 0;
  model->set_record_activation_stats(is_log_step && guard);

  auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor loss_sum = torch::zeros({}, fp32);
  std::vector<int64_t> sample_ids;  // logging.sample_ids: this step's data, in order
  for (int64_t micro = 0; micro < accum; ++micro) {
    data::Batch batch = next_batch();
    if (cfg.logging.sample_ids) {
      const auto ids = batch.sample_ids.to(torch::kCPU, torch::kInt64).contiguous();
      sample_ids.insert(sample_ids.end(), ids.data_ptr<int64_t>(),
                        ids.data_ptr<int64_t>() + ids.numel());
    }
    auto tokens = batch.tokens.to(device, /*non_blocking=*/true);
    model::LossOutput out;
    {
      optim::AutocastScope autocast(device.type(), precision);
      out = model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1));
    }
    // Each micro-batch contributes 1/accum of the step's mean loss, so the summed gradient equals
    // the gradient of one batch accum times larger.
    torch::Tensor scaled = out.loss / static_cast<double>(accum);
    if (scaler) scaled = scaled * scaler->scale();
    scaled.backward();
    loss_sum += out.ce_loss.detach();
    if (guard) {
      step_samples.ids.push_back(batch.sample_ids);
      step_samples.losses.push_back(out.per_sample_loss);
      step_samples.tokens.push_back(batch.tokens);
    }
  }
  torch::Tensor loss = loss_sum / static_cast<double>(accum);
  if (cfg.logging.sample_ids)
    files.samples.write(monitor::JsonRecord()
                            .add("step", step + 1)
                            .add("iteration", iteration)
                            .add("ids", nlohmann::json(sample_ids)));
  if (faults->nan_grad(iteration)) {
    for (auto& p : params)
      if (p.grad().defined()) {
        p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
        break;
      }
  }

  std::optional<torch::Tensor> found_inf;
  if (scaler) found_inf = scaler->unscale_(params);
  if (comm.world_size() > 1) {
    std::vector<torch::Tensor> grads;
    for (auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    grads.push_back(loss);
    comm.all_reduce_mean_(grads);
  }
  // One pass over the gradients: the per-parameter norms feed the guard's layer norms, and their
  // norm is the global norm that clipping and the alarms use.
  torch::Tensor param_norms = optim::per_param_grad_norms(params);
  torch::Tensor grad_norm = param_norms.norm();

  if (guard) {
    // One small host read per step: the guard decides before the update touches the weights.
    const auto guard_start = Clock::now();
    auto layer_norms = layers->reduce(param_norms);
    auto packed =
        torch::cat({loss.reshape({1}), grad_norm.reshape({1}), layer_norms}).to(torch::kCPU);
    auto* v = packed.data_ptr<float>();
    guard::StepSignals s;
    s.step = step;
    s.loss = v[0];
    s.grad_norm = v[1];
    s.layer_grad_norms.assign(v + 2, v + packed.numel());
    s.clipped = s.grad_norm > cfg.optim.grad_clip;
    if (scaler) s.loss_scale = scaler->scale().item<double>();
    guard::Decision d = guard->observe(s);
    nlohmann::json signals = {
        {"loss", std::isfinite(s.loss) ? nlohmann::json(s.loss) : nullptr},
        {"grad_norm", std::isfinite(s.grad_norm) ? nlohmann::json(s.grad_norm) : nullptr},
        {"lr", lr},
        {"layer_grad_norms", s.layer_grad_norms}};
    for (auto& e : d.events)
      if (e.kind != "pause") event(e.kind, e.detail);
    guard_s += seconds_since(guard_start);
    if (d.action == guard::Action::kSkip) {
      // Weights and optimizer state stay untouched; the data moves on.
      if (scaler && found_inf) scaler->update(*found_inf);
      optimizer->zero_grad();
      ++iteration;
      return;
    }
    if (d.action == guard::Action::kPause) {
      optimizer->zero_grad();
      ++iteration;
      pause_and_rollback(d, signals);
      return;
    }
    last_grad_norm_host = s.grad_norm;
  }
  apply_update(grad_norm, found_inf, lr, is_log_step, loss);
}

void Trainer::State::apply_update(const torch::Tensor& grad_norm,
                                  const std::optional<torch::Tensor>& found_inf_in, double lr,
                                  bool is_log_step, const torch::Tensor& loss) {
  double max_norm = cfg.optim.grad_clip;
  if (guard && cfg.optim.clip_mode == "adaptive" && guard->baseline_ready()) {
    // Adaptive clipping: a z-score bound on the running grad-norm statistics, never above the
    // fixed global bound.
    max_norm = std::min(
        max_norm, guard->grad_norm_mean() + cfg.optim.adaptive_clip_z * guard->grad_norm_stddev());
  }
  optim::clip_grad_norm_(params, max_norm, grad_norm);
  // A non-finite gradient never reaches the weights: the update is skipped on the device.
  torch::Tensor non_finite = grad_norm.isfinite().logical_not().to(torch::kFloat32).reshape({1});
  torch::Tensor found_inf = found_inf_in ? torch::maximum(*found_inf_in, non_finite) : non_finite;

  std::vector<torch::Tensor> before;
  if (is_log_step) before = torch::_foreach_mul(params, 1.0);  // snapshot for the update ratio

  optimizer->step(lr, found_inf);
  if (scaler) scaler->update(found_inf);
  optimizer->zero_grad();
  grad_norm_window->push(grad_norm);
  ++step;
  ++iteration;
  ++steps_since_log;
  if (guard)
    if (auto e = guard->after_update(step)) event(e->kind, e->detail);

  if (is_log_step) {
    auto delta_norms = torch::stack(torch::_foreach_norm(torch::_foreach_sub(params, before)));
    auto param_norms = torch::stack(torch::_foreach_norm(params));
    auto layer_ratio = layers->reduce(delta_norms) / layers->reduce(param_norms).clamp_min(1e-12);
    double total_ratio = (delta_norms.norm() / param_norms.norm().clamp_min(1e-12)).item<double>();
    auto ratios_cpu = layer_ratio.to(torch::kCPU).to(torch::kFloat64);
    std::vector<double> ratios(ratios_cpu.data_ptr<double>(),
                               ratios_cpu.data_ptr<double>() + ratios_cpu.numel());
    log_step(loss, grad_norm, lr, ratios, total_ratio);
  }
}

void Trainer::State::log_step(const torch::Tensor& loss, const torch::Tensor& grad_norm, double lr,
                              const std::vector<double>& update_ratios, double update_ratio) {
  last_loss = loss.item<double>();
  double elapsed = seconds_since(log_window_start);
  double norm = grad_norm.item<double>();
  double tokens_per_s = steps_since_log * tokens_per_step / std::max(elapsed, 1e-9);
  double step_ms = elapsed * 1e3 / std::max<int64_t>(steps_since_log, 1);
  data::LoaderStats loader = train_data->take_stats();
  // The guard's periodic signals (update ratios, attention drift) count toward its time too.
  std::vector<guard::GuardEvent> periodic;
  if (guard) {
    const auto guard_start = Clock::now();
    periodic = guard->observe_periodic(step, update_ratios, model->attention_output_std());
    guard_s += seconds_since(guard_start);
  }
  if (loader.waits > 0)
    event("loader_wait", {{"wait_ms", loader.wait_ms}, {"waits", loader.waits}});

  monitor::JsonRecord rec;
  rec.add("step", step)
      .add("loss", last_loss)
      .add("lr", lr)
      .add("grad_norm", norm)
      .add("grad_norm_median", guard ? guard->grad_norm_median() : grad_norm_window->median())
      .add("clipped", norm > cfg.optim.grad_clip)
      .add("update_ratio", update_ratio)
      .add("tokens_per_s", tokens_per_s)
      .add("step_ms", step_ms)
      .add("loader_wait_ms", (loader_wait_s * 1e3 + 0.0) / std::max<int64_t>(steps_since_log, 1))
      .add("guard_ms", guard_s * 1e3 / std::max<int64_t>(steps_since_log, 1))
      .add("queue_depth", loader.queue_depth);
  if (scaler) rec.add("loss_scale", scaler->scale().item<double>());
  rec.add("tokens_seen",
          micro_taken * cfg.data.micro_batch_size * comm.world_size() * cfg.model.seq_len)
      .add("samples_seen", micro_taken * cfg.data.micro_batch_size * comm.world_size());
  if (guard) {
    nlohmann::json per_layer = nlohmann::json::object();
    for (size_t i = 0; i < update_ratios.size(); ++i)
      per_layer[layers->names()[i]] = update_ratios[i];
    rec.add("update_ratio_layers", per_layer);
    if (guard->in_recovery(step)) rec.add("recovery", true);
  }
  files.metrics.write(rec);

  for (auto& e : periodic) event(e.kind, e.detail);

  monitor::ProgressSample ps;
  ps.step = step;
  ps.max_steps = cfg.run.max_steps;
  ps.loss = last_loss;
  ps.lr = lr;
  ps.grad_norm = norm;
  ps.tokens_per_s = tokens_per_s;
  ps.step_ms = step_ms;
  ps.loss_floor = loss_floor.value_or(-1.0);
  progress->update(ps);

  check_consumed();
  loader_wait_s = 0.0;
  guard_s = 0.0;
  steps_since_log = 0;
  log_window_start = Clock::now();
}

double Trainer::State::evaluate() {
  auto eval_start = Clock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  // The same validation samples every time, so successive evaluations are comparable.
  auto source = make_source(cfg, comm.rank(), comm.world_size(), /*validation=*/true);
  auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor total = torch::zeros({}, fp32);
  const int64_t batches = std::max<int64_t>(cfg.eval.batches, 1);
  for (int64_t i = 0; i < batches; ++i) {
    auto tokens = source->next().tokens.to(device);
    optim::AutocastScope autocast(device.type(), precision);
    total += model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1)).ce_loss;
  }
  std::vector<torch::Tensor> t{total / static_cast<double>(batches)};
  comm.all_reduce_mean_(t);
  last_val_loss = t[0].item<double>();
  last_eval_step = step;
  model->train();

  monitor::JsonRecord rec;
  rec.add("step", step).add("val_loss", last_val_loss);
  if (loss_floor) rec.add("floor", *loss_floor);
  files.eval.write(rec);
  // Eval time is not training time: keep it out of the next tokens/s figure.
  log_window_start += std::chrono::duration_cast<Clock::duration>(Clock::now() - eval_start);
  progress->finish();
  if (loss_floor)
    log::info("eval", "step {}: val_loss {:.4f} (floor {:.4f}, gap {:.4f})", step, last_val_loss,
              *loss_floor, last_val_loss - *loss_floor);
  else
    log::info("eval", "step {}: val_loss {:.4f}", step, last_val_loss);
  return last_val_loss;
}

Trainer::Trainer(const config::Config& cfg, std::string resolved_yaml, TrainOptions options,
                 dist::Communicator& comm)
    : s_(std::make_unique<State>(cfg, std::move(resolved_yaml), std::move(options), comm)) {}

Trainer::~Trainer() = default;

void Trainer::run() {
  State& s = *s_;
  s.setup();
  const auto& cfg = s.cfg;
  const int64_t eval_every = cfg.eval.every_steps;
  auto start = Clock::now();
  bool resumed = s.resume();
  if (!resumed) {
    s.evaluate();
    // A rollback needs a target from the very start: the initial weights are stable by definition.
    if (s.guard && cfg.stability.rollback.enabled) s.save_checkpoint(/*stable=*/true);
  }
  while (s.step < cfg.run.max_steps) {
    s.train_step();
    bool last = s.step == cfg.run.max_steps;
    bool due = eval_every > 0 && s.step % eval_every == 0 && s.step != s.last_eval_step;
    if (last || due) s.evaluate();
    s.maybe_checkpoint();
    if (int sig = g_stop_signal.load(); sig != 0 && !last) {
      s.progress->finish();
      log::warn("train", "signal {} at step {}: writing a checkpoint before exiting", sig, s.step);
      if (s.last_checkpoint_step != s.step) s.save_checkpoint(/*stable=*/false);
      s.checkpointer->wait();
      s.event("interrupted", {{"signal", sig}});
      throw Interrupted(sig);
    }
  }
  if (s.last_checkpoint_step != s.step) s.save_checkpoint(/*stable=*/false);
  s.checkpointer->wait();
  s.progress->finish();
  double elapsed = seconds_since(start);
  log::info("train", "done: {} steps in {}, final loss {:.4f}, val_loss {:.4f}", s.step,
            monitor::format_duration(elapsed), s.last_loss, s.last_val_loss);
  s.event("run_end", {{"seconds", elapsed},
                      {"loss", s.last_loss},
                      {"val_loss", s.last_val_loss},
                      {"rollbacks", s.guard ? s.guard->rollbacks() : 0}});
}

double Trainer::last_loss() const { return s_->last_loss; }
double Trainer::last_val_loss() const { return s_->last_val_loss; }

}  // namespace keel::train
