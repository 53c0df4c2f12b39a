// A start of `keel train`: every check that can refuse it and everything it builds (process
// settings, model, optimizer, data, guard, the checkpoint to resume from, restored) come before
// its first write, so a refused start leaves the run directory as it was; then the record opens.
#include <c10/cuda/CUDAFunctions.h>

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "checkpoint/file_io.h"
#include "checkpoint/hf_format.h"
#include "checkpoint/weight_parts.h"
#include "common/error.h"
#include "common/host_allocator.h"
#include "common/host_name.h"
#include "common/log.h"
#include "config/validate.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "distributed/sharded_parameters.h"
#include "schedule/schedule.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;
namespace {

// Sample ids of the validation stream live far above any training id, so the two never overlap.
constexpr int64_t kValidationIdBase = int64_t{1} << 48;
// Sequences in the reference batch the guard's diagnosis measures the model on.
constexpr int64_t kProbeSequences = 8;

void on_stop_signal(int sig) { g_stop_signal.store(sig); }

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

// run.cuda_graphs decided and logged: the graph of each micro-batch (null: eager), with the
// optimizer keeping its gradients for it. `on` where a graph cannot run is the user's mistake.
std::unique_ptr<MicroGraph> make_micro_graph(const config::Config& cfg, const torch::Device& device,
                                             bool process_group,
                                             const std::vector<torch::Tensor>& params,
                                             optim::Optimizer& optimizer) {
  const std::string obstacle = graph_obstacle(cfg, device, process_group);
  if (cfg.run.cuda_graphs == config::CudaGraphs::kOn && !obstacle.empty())
    throw ConfigError("run.cuda_graphs: on, but " + obstacle +
                      "; set it to auto (graphs where they can run) or off");
  if (cfg.run.cuda_graphs != config::CudaGraphs::kOff && obstacle.empty()) {
    optimizer.keep_gradients(true);
    log::info("train",
              "CUDA graphs: each micro-batch's forward and backward, captured after a few "
              "eager ones (run.cuda_graphs)");
    return std::make_unique<MicroGraph>(device, params);
  }
  if (device.is_cuda())
    log::info("train", "CUDA graphs off: {}",
              cfg.run.cuda_graphs == config::CudaGraphs::kOff ? std::string("run.cuda_graphs: off")
                                                              : obstacle);
  return nullptr;
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

// Every rank's "host device", in rank order: what a hardware_fault event names. One gather of
// fixed-length character codes at the start.
std::vector<std::string> rank_hosts(distributed::Communicator& comm, const torch::Device& device) {
  const std::string mine = host_name("?") + " " + device.str();
  constexpr int64_t kChars = 128;
  std::vector<int64_t> codes(kChars, 0);
  for (size_t i = 0; i < mine.size() && i < static_cast<size_t>(kChars); ++i)
    codes[i] = static_cast<unsigned char>(mine[i]);
  const auto all =
      comm.all_gather(torch::tensor(codes, torch::kInt64).to(device)).to(torch::kCPU).contiguous();
  std::vector<std::string> out(static_cast<size_t>(comm.world_size()));
  for (int r = 0; r < comm.world_size(); ++r)
    for (int64_t i = 0; i < kChars && all.data_ptr<int64_t>()[r * kChars + i] != 0; ++i)
      out[r] += static_cast<char>(all.data_ptr<int64_t>()[r * kChars + i]);
  return out;
}

std::string resolve_run_dir(const config::Config& cfg, const TrainOptions& options) {
  if (!options.run_dir.empty()) return options.run_dir;
  return (fs::path(cfg.run.out_dir) / cfg.run.name).string();
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
      "config.resolved.yaml", "metrics.jsonl", "events.jsonl", "eval.jsonl",  "samples.jsonl",
      "quarantine.jsonl",     "starts.jsonl",  "heartbeat",    "checkpoints", "forensics",
      "tensorboard",          "profile",       "report.html"};
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

// A start checks and builds everything it needs before it writes anything, so a refused start (a
// config the checkpoint cannot honour, missing data, an unreadable --init-from, a corrupt
// checkpoint) leaves the run directory byte for byte as it was; every rank refuses together.
// Only then does the record open, and a resume go on it.
void Trainer::State::setup() {
  launch.run_dir = resolve_run_dir(cfg, launch.options);
  device = select_device(cfg.run.device, launch.options.local_rank);
  if (device.is_cuda()) c10::cuda::set_device(device.index());
  std::exception_ptr refused;
  try {
    build();
  } catch (...) {
    refused = std::current_exception();
  }
  agree_to_start(refused);
  open_record();
}

void Trainer::State::agree_to_start(std::exception_ptr refused) {
  if (comm.is_process_group()) {
    std::vector<torch::Tensor> flag{
        torch::tensor({static_cast<int64_t>(refused ? 1 : 0)}, torch::kInt64).to(device)};
    comm.all_reduce_max_(flag);
    if (!refused && flag[0].item<int64_t>() != 0)
      throw UserError("another rank refused to start; its message says why");
  }
  if (refused) std::rethrow_exception(refused);
}

// The process-wide settings a run makes (threads, host allocator, matmul, determinism, seed),
// restored when the trainer ends (ProcessSettings), and the stop signals' handlers.
void Trainer::State::configure_process() {
  launch.process_settings = std::make_unique<ProcessSettings>();
  launch.stop_signals = std::make_unique<StopSignals>(on_stop_signal);
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
}

// checkpoint.stable.memory_mb resolved: auto is a quarter of this host's physical memory, shared
// among the ranks on it.
uint64_t Trainer::State::snapshot_memory_limit() const {
  return static_cast<uint64_t>(model::rollback_memory_limit(cfg, launch.options.local_world_size));
}

void Trainer::State::build() {
  configure_process();
  compute.precision = cfg.run.precision;
  build_model();

  const int rank = comm.rank(), world = comm.world_size();
  feed.train_data = make_source(cfg, rank, world, /*validation=*/false);
  feed.val_data = make_source(cfg, rank, world, /*validation=*/true);
  feed.val_start = feed.val_data->state();
  defence.probe_tokens = feed.val_data->next().tokens;
  defence.probe_tokens =
      defence.probe_tokens
          .slice(0, 0, std::min<int64_t>(kProbeSequences, defence.probe_tokens.size(0)))
          .clone();
  if (auto* synthetic = dynamic_cast<data::SyntheticSource*>(feed.train_data.get()))
    record.loss_floor = synthetic->chain().entropy_rate();
  launch.faults = std::make_unique<FaultInjector>(faults_for_rank(cfg.faults, rank, host_name("?")),
                                                  cfg.data.grad_accum_steps, cfg.model.vocab_size,
                                                  cfg.run.seed + rank);
  feed.samples_per_step = cfg.data.micro_batch_size * cfg.data.grad_accum_steps * world;
  feed.tokens_per_step = feed.samples_per_step * cfg.model.seq_len;
  if (cfg.stability.enabled)
    guard = std::make_unique<guard::Guard>(cfg.stability, compute.layers->names(),
                                           cfg.schedule.warmup_steps, feed.samples_per_step,
                                           cfg.optim.lr);
  defence.grad_norm_window =
      std::make_unique<monitor::DeviceWindow>(cfg.stability.median_window, device);

  launch.resume_source = find_resume_source(config::checkpoint_dir(cfg, launch.run_dir),
                                            launch.run_dir, launch.options.resume, rank, world);
  if (launch.resume_source) {
    check_resumable(cfg, *launch.resume_source);
    // Its own part of a sharded optimizer state does not cover what this rank owns when the
    // pieces are cut otherwise now (another zero level or bucket size, or no ZeRO): every part.
    auto& state = launch.resume_source->data.optimizer;
    if (state.count("zero.pieces") && !parallel->optimizer_state_covered_by(state))
      state = checkpoint::load_optimizer_parts(launch.resume_source->path);
    // The same for a ZeRO-3 checkpoint's weights: its own part, unless cut otherwise.
    if (checkpoint::is_weight_parts(launch.resume_source->data.model) &&
        !parallel->weights_covered_by(launch.resume_source->data.model))
      launch.resume_source->data.model = checkpoint::load_model_parts(launch.resume_source->path);
    restore(launch.resume_source->data, /*restore_data=*/true, /*restore_guard=*/true);
    launch.resume_source->data = checkpoint::CheckpointData();  // in the model and optimizer now
    launch.resumed = true;
  }
}

// The model on its device, --init-from's weights, the gradient reducer, the optimizer and scaler.
void Trainer::State::build_model() {
  // ZeRO-3 on several ranks builds the model with its parameters deferred and gives them their
  // values unit by unit as it shards them, so no rank ever holds the whole model; --init-from
  // reads the weights one tensor at a time, never a second copy of the model. Units initialized
  // in order draw what the whole model draws (model::initialize_parameter).
  const bool shard_weights = shards_weights(cfg, comm);
  std::optional<checkpoint::HfModelReader> hf;
  if (!launch.options.init_from.empty()) hf.emplace(launch.options.init_from, cfg.model);
  const distributed::ShardedParameters::InitialValues initial_values = [&](const std::string& name,
                                                                           torch::Tensor& value) {
    if (hf)
      value.copy_(hf->read(name));
    else
      model::initialize_parameter(cfg.model, name, value);
  };
  const bool deferred = shard_weights || hf;
  model =
      model::Transformer(cfg.model, deferred ? model::TransformerImpl::Parameters::kDeferred
                                             : model::TransformerImpl::Parameters::kInitialized);
  if (deferred && !shard_weights) {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      torch::Tensor value = torch::empty(item.value().sizes());
      initial_values(item.key(), value);
      item.value().set_data(value);
    }
  }
  if (hf)
    log::info(
        "model", "initial weights from {} (--init-from){}", launch.options.init_from,
        launch.options.resume.requested() ? "; a checkpoint to resume from replaces them" : "");
  // The parameters stay fp32: the master weights; autocast lowers the compute. ZeRO-3 puts each
  // unit's part on the device itself; the buffers (rotary tables) follow below.
  if (!shard_weights) model->to(device);

  for (auto& item : model->named_parameters()) {
    compute.named_params.emplace_back(item.key(), item.value());
    compute.params.push_back(item.value());
  }
  parallel = make_parallel_plan(cfg, comm, model, compute.named_params, compute.precision, device,
                                initial_values);
  if (compute.precision == optim::Precision::kFp16)
    scaler.emplace(device, cfg.run.fp16_initial_scale, /*growth_factor=*/2.0,
                   /*backoff_factor=*/0.5, cfg.run.fp16_growth_interval);
  compute.layers = std::make_unique<LayerGroups>(compute.named_params, device);
  compute.micro_graph =
      make_micro_graph(cfg, device, comm.is_process_group(), compute.params, parallel->optimizer());
}

// The first writes of a start: the run directory (an earlier run in it set aside on a fresh
// start), config.resolved.yaml, the record files, starts.jsonl, the checkpoint directory.
void Trainer::State::open_record() {
  if (comm.is_main()) {
    std::error_code ec;
    fs::create_directories(launch.run_dir, ec);
    if (ec) throw UserError("cannot create run directory " + launch.run_dir + ": " + ec.message());
    if (!launch.options.resume.requested()) set_earlier_run_aside(launch.run_dir);
    monitor::write_record_file((fs::path(launch.run_dir) / "config.resolved.yaml").string(),
                               launch.resolved_yaml);
  }
  comm.barrier();
  launch.rank_hosts = rank_hosts(comm, device);
  record.files =
      monitor::RunFiles::open(launch.run_dir, comm.is_main(), cfg.logging.sample_ids,
                              cfg.logging.tensorboard ? cfg.logging.tensorboard_every_steps : 0);
  if (comm.is_main()) launch.history = RunHistory(launch.run_dir, launch.options.resume.name());
  defence.screen.open(cfg.stability, guard.get(), record.files.quarantine, *feed.train_data);
  record.progress = std::make_unique<monitor::Progress>(cfg.logging.progress, comm.is_main());
  record.step_record = std::make_unique<StepRecord>(record.files, *record.progress,
                                                    cfg.run.max_steps, record.loss_floor);
  const int rank = comm.rank(), world = comm.world_size();
  // An async save's barriers run on its writer thread while training runs collectives: they go
  // through the store. Every rank saves at the same steps, so the count names the same barrier.
  checkpoint::Checkpointer::Barrier barrier = [this] { comm.barrier(); };
  if (cfg.checkpoint.async && comm.is_process_group())
    barrier = [this, count = int64_t{0}]() mutable {
      comm.barrier_out_of_band("checkpoint/" + std::to_string(count++));
    };
  saves.checkpointer = std::make_unique<checkpoint::Checkpointer>(
      config::checkpoint_dir(cfg, launch.run_dir), cfg.checkpoint, rank, world, KEEL_VERSION,
      checkpoint::xxh3_hex_of(launch.resolved_yaml), barrier);
  saves.checkpointer->set_memory_limit(snapshot_memory_limit());
  defence.forensics =
      std::make_unique<Forensics>(launch.run_dir, cfg.stability.top_k_samples,
                                  compute.layers->names(), comm, device, *feed.train_data);
  defence.recovery = std::make_unique<Recovery>(recovery_parts());
  model::MemoryPlanOptions plan;
  plan.world_size = world;
  plan.cuda = device.is_cuda();
  plan.cuda_graphs = compute.micro_graph != nullptr;
  record.memory_watch = std::make_unique<MemoryWatch>(model::plan_memory(cfg, plan), device);

  log::info("train", "run directory {}", launch.run_dir);
  log::info("model", "{} with {:.2f}M parameters, {:.2f} MFLOPs/token, on {} in {}",
            config::name_of(cfg.model.arch), model->num_parameters() / 1e6,
            model->flops_per_token() / 1e6, device.str(), config::name_of(cfg.run.precision));
  log::info("optim", "{} lr {} (schedule {}, warmup {}), global batch {} sequences = {} tokens",
            parallel->optimizer().describe(), cfg.optim.lr, config::name_of(cfg.schedule.kind),
            cfg.schedule.warmup_steps, feed.samples_per_step, feed.tokens_per_step);
  if (record.loss_floor)
    log::info("data", "synthetic chain: entropy rate {:.4f} nats/token is the loss floor",
              *record.loss_floor);
  if (!cfg.faults.empty())
    log::warn("faults", "{} fault(s) will be injected (a rehearsal, not a production run)",
              cfg.faults.size());

  event(EventKind::kRunStart, {{"world_size", world},
                               {"device", device.str()},
                               {"parameters", model->num_parameters()},
                               {"flops_per_token", model->flops_per_token()},
                               {"resume", launch.options.resume.name()}});
}

void Trainer::State::start_profiler() {
  constexpr int64_t kWarmSteps = 2;  // allocations, caches, (on a GPU) autotuning
  const int64_t steps = launch.options.profile_steps;
  if (steps <= 0) return;
  const int64_t remaining = cfg.run.max_steps - counters.step;
  const int64_t skip = std::clamp<int64_t>(remaining - steps, 0, kWarmSteps);
  if (skip < kWarmSteps && comm.is_main())
    log::warn("train",
              "--profile {}: this start has {} step(s) left, so the trace {}; give at most {} "
              "steps to record after the first {} (allocations, caches, autotuning)",
              steps, remaining,
              steps >= remaining
                  ? fmt::format("records all {} of them, from the first", remaining)
                  : fmt::format("starts after {} warm step(s), not {}", skip, kWarmSteps),
              std::max<int64_t>(remaining - kWarmSteps, 1), kWarmSteps);
  record.profiler = std::make_unique<monitor::StepProfiler>(
      steps, skip, launch.run_dir + "/profile", comm.rank(), device.is_cuda());
}

void Trainer::State::finish_profile(bool last) {
  const std::string path = record.profiler->after(counters.step, last);
  if (path.empty()) return;
  log::info("train", "profile written to {} (open it in chrome://tracing or ui.perfetto.dev)",
            path);
  record.profiler.reset();
}

}  // namespace keel::train
