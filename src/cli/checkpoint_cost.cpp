#include "cli/checkpoint_cost.h"

#include <torch/torch.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/file_io.h"
#include "common/clock.h"
#include "common/error.h"
#include "config/validate.h"

namespace keel::cli {
namespace {

constexpr size_t kProbeBytes = size_t{64} << 20;  // large enough to pass the disk's write cache

// Writes `bytes` through the checkpoint writer (hash as it goes, fsync at the end) into `dir`,
// as a save would, and returns bytes/s. The file is removed afterwards.
std::optional<double> probe_disk_write(const std::filesystem::path& dir, size_t bytes) {
  const auto path = dir / fmt::format(".keel-validate-probe-{}", static_cast<long>(getpid()));
  std::vector<char> block(size_t{4} << 20, '\x5a');
  std::optional<double> rate;
  try {
    const auto t0 = Clock::now();
    checkpoint::HashingWriter writer(path);
    for (size_t done = 0; done < bytes; done += block.size())
      writer.write(block.data(), std::min(block.size(), bytes - done));
    writer.finish(/*do_fsync=*/true);
    checkpoint::fsync_dir(dir);
    rate = static_cast<double>(bytes) / std::max(seconds_since(t0), 1e-9);
  } catch (const CheckpointError&) {
    // Not writable or full: validate() reports that with the key's location; no figure here.
  }
  std::error_code ec;
  checkpoint::remove_tree(path, ec);
  return rate;
}

// An async save's training stall is the copy of every tensor into host memory.
double probe_host_copy(size_t bytes) {
  std::vector<char> src(bytes, '\x11'), dst(bytes);
  std::memcpy(dst.data(), src.data(), bytes);  // first touch of both buffers, not timed
  const auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), bytes);
  return static_cast<double>(bytes) / std::max(seconds_since(t0), 1e-9);
}

// Peak matmul throughput of this LibTorch on the run's device in the run's precision: the best of
// a few square matmuls after a warm-up. nullopt when the run asks for CUDA and this machine has
// none (a GPU config validated on a login node).
std::optional<double> probe_matmul(const config::RunConfig& run) {
  if (run.device == config::Device::kCuda && !torch::cuda::is_available()) return std::nullopt;
  const bool cuda = run.device == config::Device::kCuda ||
                    (run.device == config::Device::kAuto && torch::cuda::is_available());
  const torch::Device device = cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  torch::Dtype dtype = torch::kFloat32;
  if (run.precision == config::Precision::kBf16) dtype = torch::kBFloat16;
  if (run.precision == config::Precision::kFp16 && cuda) dtype = torch::kFloat16;
  const int64_t n = cuda ? 8192 : 1024;
  torch::NoGradGuard no_grad;
  const auto a = torch::randn({n, n}, torch::TensorOptions().device(device).dtype(dtype));
  const auto b = torch::randn({n, n}, torch::TensorOptions().device(device).dtype(dtype));
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  (void)torch::mm(a, b);
  sync();
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    (void)torch::mm(a, b);
    sync();
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}

std::string bytes_text(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.0f} kB", b / 1e3);
}

std::string seconds_text(double s) {
  if (s >= 100) return fmt::format("{:.0f} s", s);
  if (s >= 1) return fmt::format("{:.2f} s", s);
  return fmt::format("{:.1f} ms", s * 1e3);
}

}  // namespace

CheckpointCost estimate_checkpoint_cost(const config::Config& cfg,
                                        const CheckpointCostOptions& options) {
  CheckpointCost cost;
  cost.parameters = config::parameter_count(cfg.model);
  cost.checkpoint_bytes = static_cast<double>(config::estimate_checkpoint_bytes(cfg));
  const double tokens_per_step = static_cast<double>(cfg.data.micro_batch_size) *
                                 static_cast<double>(cfg.data.grad_accum_steps) *
                                 static_cast<double>(options.world_size) *
                                 static_cast<double>(cfg.model.seq_len);
  cost.flops_per_step = config::flops_per_token(cfg.model) * tokens_per_step;
  cost.auto_interval = cfg.checkpoint.every_steps == config::kAuto;
  if (!cost.auto_interval)
    cost.interval_steps =
        cfg.checkpoint.every_steps > 0 ? cfg.checkpoint.every_steps : cfg.run.max_steps;

  if (options.probe) {
    const auto dir = config::nearest_existing_dir(config::checkpoint_dir(cfg));
    cost.probe_dir = dir.string();
    const size_t probe_bytes = std::clamp<size_t>(static_cast<size_t>(cost.checkpoint_bytes),
                                                  size_t{1} << 20, kProbeBytes);
    cost.disk_write_bytes_per_s = probe_disk_write(dir, probe_bytes);
    cost.host_copy_bytes_per_s = probe_host_copy(probe_bytes);
    cost.matmul_flops_per_s = probe_matmul(cfg.run);
    cost.device_absent = !cost.matmul_flops_per_s;
  }
  if (options.step_seconds) {
    cost.step_seconds = options.step_seconds;
    cost.step_seconds_measured = true;
  } else if (cost.matmul_flops_per_s) {
    cost.step_seconds = cost.flops_per_step / (*cost.matmul_flops_per_s * kAssumedMfu);
  }
  if (cost.disk_write_bytes_per_s) {
    cost.write_seconds = cost.checkpoint_bytes / *cost.disk_write_bytes_per_s;
    if (cfg.checkpoint.async && cost.host_copy_bytes_per_s)
      cost.stall_seconds = cost.checkpoint_bytes / *cost.host_copy_bytes_per_s;
    else if (!cfg.checkpoint.async)
      cost.stall_seconds = cost.write_seconds;
  }
  if (cost.auto_interval && cost.stall_seconds && cost.step_seconds)
    cost.interval_steps = checkpoint::auto_interval(*cost.stall_seconds, *cost.step_seconds,
                                                    cfg.checkpoint.max_overhead, cfg.run.max_steps);
  if (cost.interval_steps > 0 && cost.interval_steps < cfg.run.max_steps)
    cost.stable_interval_steps = checkpoint::stable_interval(cfg.checkpoint, cost.interval_steps);
  if (cost.stall_seconds && cost.step_seconds && cost.interval_steps > 0) {
    const double train = static_cast<double>(cost.interval_steps) * *cost.step_seconds;
    cost.share = *cost.stall_seconds / (train + *cost.stall_seconds);
  }
  return cost;
}

std::string format_checkpoint_cost(const CheckpointCost& c, const config::Config& cfg) {
  std::string out;
  auto line = [&](const std::string& s) { out += "estimate: " + s + "\n"; };
  line(fmt::format("checkpoint {} ({:.2f}M parameters: fp32 weights + AdamW moments)",
                   bytes_text(c.checkpoint_bytes), c.parameters / 1e6));
  if (c.disk_write_bytes_per_s && c.write_seconds)
    line(fmt::format("checkpoint write {} at {:.2f} GB/s (measured: {} written and fsynced in {})",
                     seconds_text(*c.write_seconds), *c.disk_write_bytes_per_s / 1e9,
                     bytes_text(std::min<double>(c.checkpoint_bytes, kProbeBytes)), c.probe_dir));
  else if (!c.probe_dir.empty())
    line("checkpoint write: unknown (the disk probe could not write in " + c.probe_dir + ")");
  if (c.device_absent && !c.step_seconds_measured)
    line(
        fmt::format("step time: not estimated (run.device {} is not on this machine); pass "
                    "--step-time SECONDS for the checkpoint share",
                    config::name_of(cfg.run.device)));
  if (c.step_seconds) {
    if (c.step_seconds_measured)
      line(fmt::format("step time {} (given with --step-time)", seconds_text(*c.step_seconds)));
    else
      line(
          fmt::format("step time {} ({:.3g} GFLOP per step at {:.0f}% of the measured {} matmul "
                      "peak {:.1f} TFLOP/s; pass --step-time for a measured figure)",
                      seconds_text(*c.step_seconds), c.flops_per_step / 1e9, kAssumedMfu * 100,
                      config::name_of(cfg.run.precision), *c.matmul_flops_per_s / 1e12));
  }
  if (c.auto_interval) {
    if (c.interval_steps > 0)
      line(fmt::format(
          "checkpoint.every_steps auto: every {} steps, stable candidates every {} "
          "(the interval at which a save costs {:.1f}% of training time, or closer where a run "
          "keeps its minimum of {} checkpoints; the run measures its own save and step times "
          "at step {} and decides again)",
          c.interval_steps, c.stable_interval_steps, cfg.checkpoint.max_overhead * 100,
          checkpoint::kMinAutoCheckpoints, checkpoint::kCadenceProbeStep));
    else
      line(
          fmt::format("checkpoint.every_steps auto: decided at step {} from the measured save and "
                      "step times (a save costs {:.1f}% of training time, or more where a run "
                      "keeps its minimum of {} checkpoints)",
                      checkpoint::kCadenceProbeStep, cfg.checkpoint.max_overhead * 100,
                      checkpoint::kMinAutoCheckpoints));
  }
  if (c.stall_seconds && c.interval_steps > 0) {
    const std::string every = c.interval_steps < cfg.run.max_steps
                                  ? fmt::format("every {} steps", c.interval_steps)
                                  : std::string("once, at the end");
    std::string what =
        cfg.checkpoint.async ? "async: the copy to host memory" : "sync: the whole write";
    if (c.share)
      line(
          fmt::format("checkpointing {} stalls training {} per save ({}), {:.2f}% of training time",
                      every, seconds_text(*c.stall_seconds), what, *c.share * 100));
    else
      line(fmt::format("checkpointing {} stalls training {} per save ({})", every,
                       seconds_text(*c.stall_seconds), what));
  }
  if (c.probe_dir.empty() && !c.step_seconds_measured)
    line("write time and training share not measured (--no-probe)");
  return out;
}

}  // namespace keel::cli
