#include "cli/checklist.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "common/error.h"
#include "data/foreign_formats.h"
#include "data/shard_reader.h"
#include "guard/schedule_watch.h"
#include "schedule/schedule.h"

namespace keel::cli {
namespace {

using Status = ChecklistItem::Status;
namespace fs = std::filesystem;

// report.json of the prepared dataset, or null when there is none to read.
nlohmann::json prepare_report(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "report.json");
  if (!in) return nullptr;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
}

std::string cadence(const config::CheckpointConfig& c) {
  if (c.every_steps == config::kAuto)
    return fmt::format(
        "checkpoint.every_steps auto (a save costs {:.1f} % of training time, measured by the "
        "run, or more where a short run keeps its minimum of {} checkpoints)",
        c.max_overhead * 100, checkpoint::kMinAutoCheckpoints);
  if (c.every_steps == 0) return "checkpoint.every_steps 0: only at the end of the run";
  return fmt::format("every {} steps", c.every_steps);
}

// What the schedule does after its warmup, kind by kind (schedule/schedule.h), in the step
// numbers the run counts (1-based: step N is the N-th update).
std::string lr_decay(const config::ScheduleConfig& s, int64_t max_steps) {
  switch (s.kind) {
    case config::ScheduleKind::kCosine:
      return fmt::format("cosine to {} x peak at step {}", s.min_lr_ratio, max_steps);
    case config::ScheduleKind::kThreePhase: {
      const int64_t decay = schedule::decay_start(s, max_steps);
      if (decay >= max_steps)
        return "three_phase: the peak from the warmup's end to the last step, no decay "
               "(schedule.phases.decay leaves it no steps)";
      return fmt::format(
          "three_phase: the peak until step {}, then exponential decay to {} x peak at step {}",
          decay, s.min_lr_ratio, max_steps);
    }
    case config::ScheduleKind::kConstant:
      break;
  }
  return "constant: the peak lr from the warmup's end to the last step, no decay "
         "(schedule.min_lr_ratio is not used)";
}

}  // namespace

namespace {

// The optimizer's items: AdamW, beta2, clipping, precision.
void check_optimizer(const config::Config& cfg, std::vector<ChecklistItem>& out) {
  auto add = [&](std::string item, Status status, std::string what) {
    out.push_back({std::move(item), status, std::move(what)});
  };
  const auto& o = cfg.optim;
  const auto& st = cfg.stability;

  if (o.name == config::OptimizerName::kAdamW)
    add("optimizer", Status::kOk,
        fmt::format("AdamW with decoupled weight decay {} (applied to the weights, not through "
                    "the gradient), lr {} from the {} schedule, a function of the step alone",
                    o.weight_decay, o.lr, config::name_of(cfg.schedule.kind)));
  else
    add("optimizer", Status::kWarn,
        "Lion (optim.name): the checklist keeps AdamW for transformers; Lion suits multimodal or "
        "non-transformer models");

  const double beta2 = o.betas.size() == 2 ? o.betas[1] : 0.0;
  add("beta2", beta2 >= 0.999 ? Status::kWarn : Status::kOk,
      beta2 >= 0.999 ? fmt::format("optim.betas[1] = {}: a long second-moment memory keeps the "
                                   "effective lr high late in training (loss jitter); 0.95 is "
                                   "the remedy",
                                   beta2)
                     : fmt::format("optim.betas[1] = {} (0.95 damps late-training jitter)", beta2));

  add("gradient clipping", o.grad_clip > 1.0 ? Status::kWarn : Status::kOk,
      fmt::format("global L2 norm clipped at {} ({}; 1.0 as the fuse, 0.5 in strict settings); "
                  "clip rate watched, warns above {:.0f} % of steps",
                  o.grad_clip, config::name_of(o.clip_mode), st.clip_rate_warn * 100));

  switch (cfg.run.precision) {
    case config::Precision::kBf16:
      add("mixed precision", Status::kOk,
          "bf16 autocast over fp32 master weights; AdamW moments kept in fp32");
      break;
    case config::Precision::kFp16:
      add("mixed precision", Status::kWarn,
          "fp16 with dynamic loss scaling and a watch on the scale; bf16 has the range fp16 "
          "lacks: prefer it where the hardware has it. AdamW moments kept in fp32");
      break;
    case config::Precision::kFp32:
      add("mixed precision", Status::kOk,
          "fp32 throughout (run.precision; bf16 autocast is the choice on a GPU); AdamW moments "
          "in fp32");
      break;
  }
}

// "config locked": whether the stability keys can be overridden from the command line.
ChecklistItem check_lock(const config::Config& cfg) {
  const auto& p = cfg.production;
  if (p.locked)
    return {"config locked", Status::kOk,
            fmt::format("production.locked: --set cannot override {} pattern(s) of stability keys "
                        "({}{}) and faults are refused",
                        p.locked_keys.size(), p.locked_keys.empty() ? "" : p.locked_keys[0],
                        p.locked_keys.size() > 1 ? ", ..." : "")};
  return {"config locked", Status::kOff,
          "production.locked is false: any key can be overridden with --set (lock a production "
          "config)"};
}

// "data verified": meta.json lists a checksum for every shard and the index, every file is there
// at the size meta.json implies, and prepare's report is there. Reading the checksums' bytes is
// the loader's job (it checks each file as it opens it); validate stays cheap on a large corpus.
ChecklistItem check_verified(const config::Config& cfg, const nlohmann::json& report) {
  if (cfg.data.source == config::DataSource::kSynthetic)
    return {"data verified", Status::kNotApplicable, "synthetic data: generated, not read"};
  if (cfg.data.source != config::DataSource::kShards) {
    try {
      const auto s = data::summarize_foreign(cfg.data.source, cfg.data.path);
      return {"data verified", Status::kWarn,
              fmt::format("{} ({}): {} file(s), {:.1f}M tokens{}, headers and index consistent; "
                          "the format has no checksums of its tokens (the loader checks every id "
                          "against model.vocab_size)",
                          cfg.data.path, config::name_of(cfg.data.source), s.files, s.tokens / 1e6,
                          s.documents >= 0 ? fmt::format(", {} documents", s.documents) : "")};
    } catch (const std::exception& e) {
      return {"data verified", Status::kWarn, e.what()};
    }
  }
  try {
    const data::DatasetMeta meta = data::read_meta(cfg.data.path);  // refuses a missing xxh3
    int64_t shards = 0, tokens = 0;
    for (const auto& [name, split] : meta.splits) {
      for (const auto& shard : split.shards) {
        const fs::path file = fs::path(cfg.data.path) / shard.file;
        const auto want =
            static_cast<uintmax_t>(sizeof(data::FileHeader) + shard.tokens * meta.token_bytes);
        std::error_code ec;
        const uintmax_t size = fs::file_size(file, ec);
        if (ec || size != want)
          return {"data verified", Status::kWarn,
                  fmt::format("{}: {} bytes, meta.json implies {}{}", file.string(), ec ? 0 : size,
                              want, ec ? " (missing)" : " (truncated or replaced)")};
        ++shards;
        tokens += shard.tokens;
      }
      std::error_code ec;
      if (!fs::exists(fs::path(cfg.data.path) / split.index_file, ec))
        return {"data verified", Status::kWarn,
                (fs::path(cfg.data.path) / split.index_file).string() + ": missing"};
    }
    return {"data verified", report.is_null() ? Status::kWarn : Status::kOk,
            fmt::format("{}: meta.json lists an xxh3 for each of {} shard(s) ({:.1f}M tokens) and "
                        "the index; every file is there at its size; {}",
                        cfg.data.path, shards, tokens / 1e6,
                        report.is_null() ? "no report.json: what prepare removed is unknown"
                                         : "prepare's report.json is there")};
  } catch (const std::exception& e) {
    return {"data verified", Status::kWarn, e.what()};
  }
}

// The data's items: dedup, out-of-distribution filtering, cross-cluster sampling, backpressure.
void check_data(const config::Config& cfg, std::vector<ChecklistItem>& out) {
  auto add = [&](std::string item, Status status, std::string what) {
    out.push_back({std::move(item), status, std::move(what)});
  };
  const auto& st = cfg.stability;
  const bool shards = cfg.data.source == config::DataSource::kShards;
  const bool synthetic = cfg.data.source == config::DataSource::kSynthetic;
  const nlohmann::json report = shards ? prepare_report(cfg.data.path) : nullptr;
  if (synthetic) {
    add("dedup", Status::kNotApplicable, "synthetic data: nothing to deduplicate");
    add("out-of-distribution filtering", st.screen.enabled ? Status::kOk : Status::kOff,
        st.screen.enabled ? "synthetic data; the per-sample screen masks outlier samples"
                          : "synthetic data; stability.screen.enabled is false");
  } else if (report.is_null()) {
    add("dedup", Status::kWarn,
        shards ? "no report.json in " + cfg.data.path + ": how the data was deduplicated is unknown"
               : "pre-tokenized data (" + std::string(config::name_of(cfg.data.source)) +
                     "): how it was deduplicated is unknown; repeated_data watches for returns");
    add("out-of-distribution filtering", st.screen.enabled ? Status::kOk : Status::kOff,
        st.screen.enabled ? "the per-sample screen masks outlier samples in training"
                          : "stability.screen.enabled is false");
  } else {
    const auto& d = report["dedup"];
    const bool exact = d.value("exact", false), near = d.value("near", false);
    add("dedup", exact && near ? Status::kOk : Status::kWarn,
        fmt::format("keel prepare removed {} exact and {} near duplicates (MinHash, {}){}",
                    report.value("exact_duplicates", 0), report.value("near_duplicates", 0),
                    d.value("scheme", "keel") == "datatrove"
                        ? std::string("datatrove's scheme: every LSH candidate")
                        : fmt::format("Jaccard >= {}", d.value("threshold", 0.0)),
                    exact && near ? "" : ": exact or near dedup was switched off"));
    const double tails = report["length_filter"].value("drop_percentile_tails", 0.0);
    add("out-of-distribution filtering", st.screen.enabled ? Status::kOk : Status::kWarn,
        fmt::format("{} documents removed by length (tails {} %), {} by repetition; the "
                    "per-sample screen {}",
                    report.value("removed_by_length", 0), tails,
                    report.value("removed_by_repetition", 0),
                    st.screen.enabled ? "masks outlier samples in training"
                                      : "is off (stability.screen.enabled)"));
  }

  if (synthetic)
    add("cross-cluster sampling", Status::kNotApplicable, "synthetic data has no clusters");
  else if (cfg.data.sampling == config::Sampling::kStratified &&
           cfg.data.min_clusters_per_batch >= 2)
    add("cross-cluster sampling", Status::kOk,
        fmt::format("stratified over {} buckets, at least {} clusters in every micro-batch",
                    cfg.data.buckets, cfg.data.min_clusters_per_batch));
  else
    add("cross-cluster sampling", Status::kWarn,
        fmt::format("data.sampling {} with min_clusters_per_batch {}: batches may come from one "
                    "cluster (gradient variance)",
                    config::name_of(cfg.data.sampling), cfg.data.min_clusters_per_batch));

  out.push_back(check_verified(cfg, report));
  if (synthetic)
    add("backpressure", Status::kNotApplicable,
        "synthetic data is made as it is needed: there is no source to wait for");
  else
    add("backpressure", Status::kOk,
        fmt::format("{} loader worker(s) read {}; training waits below {} ready batches (refills "
                    "to {}), never pads or repeats; stops after {} s without a batch; "
                    "consumed-vs-steps cross-check at {:.0f} %",
                    cfg.data.loader.workers, cfg.data.path, cfg.data.loader.low_watermark,
                    cfg.data.loader.high_watermark, cfg.data.loader.stall_timeout_s,
                    cfg.data.consumed_tolerance * 100));
}

// The schedule's and the defences' items: warmup, lr decay, the alarm, checkpoints, snapshots.
void check_schedule_and_recovery(const config::Config& cfg, int64_t parameters,
                                 std::vector<ChecklistItem>& out) {
  auto add = [&](std::string item, Status status, std::string what) {
    out.push_back({std::move(item), status, std::move(what)});
  };
  const auto& st = cfg.stability;
  const int64_t warmup = config::warmup_steps(cfg.schedule, cfg.run.max_steps);
  const bool large = parameters > 1'000'000'000;
  add("warmup", large && warmup < 2000 ? Status::kWarn : Status::kOk,
      fmt::format("{} warmup steps for {:.1f}M parameters{}", warmup, parameters / 1e6,
                  large && warmup < 2000 ? ": start at 2,000 or more for a model this size"
                                         : " (2,000 to start at scale, longer for larger models)"));

  add("lr decay by step", Status::kOk,
      lr_decay(cfg.schedule, cfg.run.max_steps) +
          ": a function of the optimizer step, never of wall time; the recovery overlay scales "
          "it");

  if (st.enabled)
    add("two-level alarm", Status::kOk,
        fmt::format("grad norm {}x its running median warns, {}x (or the loss {}x) pauses, "
                    "writes forensics and rolls back",
                    st.warn_factor, st.pause_factor, st.loss_alarm_factor));
  else
    add("two-level alarm", Status::kOff, "stability.enabled is false: nothing watches the run");

  if (st.enabled)
    add("schedule back-off", Status::kOk,
        fmt::format("the attention output past {:.0f}x its value at initialisation within the "
                    "warmup (and as long again after it) rolls back to the attempt's start and "
                    "lowers the peak lr by {:.3g}x, up to {} times, then exit 3; the guard's, not "
                    "the command line's: it applies to a locked config too",
                    guard::kGrowthAlarm, guard::kBackoffFactor, guard::kMaxBackoffs));
  else
    add("schedule back-off", Status::kOff,
        "stability.enabled is false: nothing lowers a peak lr the model cannot take");
  add("checkpoint contents", cfg.checkpoint.every_steps == 0 ? Status::kWarn : Status::kOk,
      "model, optimizer state, schedule position, data position, RNG and guard state, written "
      "atomically with checksums; " +
          cadence(cfg.checkpoint));

  if (st.enabled && st.rollback.enabled && cfg.checkpoint.every_steps != 0)
    add("stable snapshots", Status::kOk,
        fmt::format("{} a stable candidate, promoted when {} passed without an alarm; a rollback "
                    "goes back to the newest, then {} steps at {} x lr",
                    cfg.checkpoint.stable.every_steps > 0
                        ? fmt::format("every {} steps", cfg.checkpoint.stable.every_steps)
                        : std::string("every checkpoint"),
                    cfg.checkpoint.stable.window == config::kAuto
                        ? std::string("the checkpoint interval before it")
                        : fmt::format("the {} steps before it", cfg.checkpoint.stable.window),
                    config::recovery_steps(st, cfg.run.max_steps), st.recovery.lr_factor));
  else
    add("stable snapshots", Status::kOff,
        !st.enabled ? "stability.enabled is false: no stable snapshots, no rollback"
        : !st.rollback.enabled
            ? "stability.rollback.enabled is false: alarms skip steps instead of rolling back"
            : "checkpoint.every_steps 0: the only stable snapshot is the start of the run");
}

}  // namespace

std::vector<ChecklistItem> walk_checklist(const config::Config& cfg, int64_t parameters,
                                          const Rehearsal* rehearsal) {
  std::vector<ChecklistItem> out;
  out.push_back(check_lock(cfg));
  check_optimizer(cfg, out);
  check_data(cfg, out);
  check_schedule_and_recovery(cfg, parameters, out);
  if (rehearsal) {
    out.push_back(
        {"rollback rehearsed", rehearsal->passed ? Status::kOk : Status::kWarn, rehearsal->what});
    out.push_back({"lr against the model", rehearsal->lr_quiet ? Status::kOk : Status::kWarn,
                   rehearsal->lr_what});
  } else {
    out.push_back({"rollback rehearsed", Status::kNotApplicable,
                   "not run here: `keel validate --rehearse` runs this config's model with a bad "
                   "batch and an lr spike and reports pause -> rollback -> recovery"});
    out.push_back({"lr against the model", Status::kNotApplicable,
                   "not measured here: `keel validate --rehearse` reports whether the attention "
                   "output stays quiet through the warmup at the configured peak, and the peak at "
                   "which it would not"});
  }
  return out;
}

std::string format_checklist(const std::vector<ChecklistItem>& items) {
  std::string out = "checklist (the seed's pre-launch list, §6.3):\n";
  for (const auto& i : items) {
    const char* mark = i.status == Status::kOk     ? "ok  "
                       : i.status == Status::kWarn ? "WARN"
                       : i.status == Status::kOff  ? "OFF "
                                                   : "n/a ";
    out += fmt::format("  [{}] {}: {}\n", mark, i.item, i.what);
  }
  return out;
}

}  // namespace keel::cli
