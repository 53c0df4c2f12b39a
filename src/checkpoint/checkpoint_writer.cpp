// The write side of Checkpointer: the commit protocol of checkpointer.h (staging directory,
// every rank's files, MANIFEST last, one rename), in three steps.
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>

#include "checkpoint/checkpointer.h"
#include "checkpoint/file_io.h"
#include "checkpoint/layout.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_parts.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"

namespace keel::checkpoint {
namespace fs = std::filesystem;
using namespace internal;

// Rank 0 creates step_N.tmp-<pid> (after clearing leftovers of dead processes); the other ranks
// find it after the first barrier.
fs::path Checkpointer::staging_dir(const std::string& name) {
  const std::string tmp_prefix = name + ".tmp-";
  fs::path staging;
  if (rank_ == 0) {
    remove_stale_tmp();
    staging = dir_ / (tmp_prefix + std::to_string(::getpid()));
    if (::mkdir(staging.c_str(), 0755) != 0) throw_io_error(staging, "cannot create", errno);
  }
  if (world_size_ <= 1) return staging;
  barrier_();  // #1: the staging directory exists
  if (rank_ == 0) return staging;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    std::string n = de.path().filename().string();
    if (n.compare(0, tmp_prefix.size(), tmp_prefix) == 0 && de.is_directory()) {
      if (!staging.empty())
        throw CheckpointError(dir_.string() + ": more than one staging directory for " + name +
                              " (another run writing here?)");
      staging = de.path();
    }
  }
  if (staging.empty())
    throw CheckpointError(dir_.string() + ": rank 0's staging directory for " + name +
                          " is not visible (checkpoint.dir must be on a shared filesystem)");
  return staging;
}

// This rank's files into `staging`, each listed with its size and xxh3 in `files`; ranks other
// than 0 also write that listing as files.rank{r}.json for rank 0 to fold into the MANIFEST.
uint64_t Checkpointer::write_rank_files(const fs::path& staging, int64_t step,
                                        const CheckpointData& data, nlohmann::ordered_json& files) {
  uint64_t total_bytes = 0;
  auto record = [&](const std::string& file, const FileDigest& d) {
    files[file] = {{"size", d.size}, {"xxh3", xxh3_hex(d.xxh3)}};
    total_bytes += d.size;
  };
  const StringMap meta = {
      {"format", "pt"}, {"keel_version", keel_version_}, {"step", std::to_string(step)}};
  if (data.model_in_parts) {  // ZeRO-3: every rank its own part (weight_parts.h)
    std::string part = rank_file("model", rank_, "safetensors");
    record(part, write_safetensors(staging / part, data.model, meta));
  } else if (rank_ == 0) {
    record("model.safetensors", write_safetensors(staging / "model.safetensors", data.model, meta));
  }
  std::string opt = rank_file("optimizer", rank_, "safetensors");
  record(opt, write_safetensors(staging / opt, data.optimizer, meta));
  std::string extra = rank_file("extra", rank_, "safetensors");
  record(extra, write_safetensors(staging / extra, data.extra_tensors, meta));
  if (rank_ == 0) {
    record("trainer_state.json",
           write_new_file(staging / "trainer_state.json", data.trainer_state.dump(2) + "\n"));
    record("config.yaml", write_new_file(staging / "config.yaml", data.config_yaml));
  } else {
    write_new_file(staging / rank_file("files", rank_, "json"), files.dump(2) + "\n");
  }
  return total_bytes;
}

// Rank 0: the other ranks' listings folded in, MANIFEST written last, the staging directory
// renamed to step_N (swapped with an existing one). Returns the bytes of the whole checkpoint.
uint64_t Checkpointer::commit(const fs::path& staging, int64_t step, bool stable,
                              bool optimizer_sharded, nlohmann::ordered_json files,
                              uint64_t total_bytes) {
  for (int r = 1; r < world_size_; ++r) {
    std::string listing = rank_file("files", r, "json");
    std::string text = read_file(staging / listing);  // throws naming the file if absent
    auto j = nlohmann::ordered_json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw CheckpointError((staging / listing).string() + ": not valid JSON");
    for (auto& [k, v] : j.items()) {
      files[k] = v;
      total_bytes += v.at("size").get<uint64_t>();
    }
    files[listing] = {{"size", text.size()},
                      {"xxh3", xxh3_hex(XXH3_64bits(text.data(), text.size()))}};
    total_bytes += text.size();
  }
  auto now = std::chrono::system_clock::now();
  nlohmann::ordered_json manifest = {
      {"format", kFormat},
      {"format_version", kFormatVersion},
      {"step", step},
      {"world_size", world_size_},
      {"stable", stable},
      // ZeRO-1: each optimizer.rank{r} holds one rank's part of the state (zero.pieces says
      // which), not a whole copy; a resume at another world size reads all of them.
      {"optimizer_sharded", optimizer_sharded},
      {"keel_version", keel_version_},
      {"config_hash", config_hash_},
      {"created", utc_now_iso(now)},
      {"created_unix_ns",
       std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()},
      {"files", files},
  };
  write_new_file(staging / kManifest, manifest.dump(2) + "\n");
  fsync_dir(staging);
  const fs::path final_dir = dir_ / step_dir_name(step);
  // step_N may exist already (saved again after a rollback or resume): then the two are swapped
  // so a reader sees the old or the new checkpoint, and the caller drops the old one (at
  // `staging`).
  bool exchanged = false;
  if (const int err = rename_or_exchange(staging, final_dir, &exchanged); err != 0)
    throw_io_error(final_dir, "rename failed", err);
  fsync_dir(dir_);
  return total_bytes;
}

void Checkpointer::write_checkpoint(int64_t step, const CheckpointData& data, bool stable) {
  auto t0 = Clock::now();
  const std::string name = step_dir_name(step);
  const fs::path staging = staging_dir(name);
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  uint64_t total_bytes = 0;
  try {
    total_bytes = write_rank_files(staging, step, data, files);
  } catch (...) {
    if (rank_ == 0) remove_quietly(staging);
    throw;
  }
  if (world_size_ > 1) barrier_();  // #2: every rank's files are on disk

  if (rank_ == 0) {
    try {
      total_bytes = commit(staging, step, stable, data.optimizer.count("zero.pieces") > 0,
                           std::move(files), total_bytes);
    } catch (...) {
      remove_quietly(staging);
      throw;
    }
    remove_quietly(staging);  // the replaced checkpoint, if any; absent otherwise
    replace_file_atomic(dir_ / "LATEST", name + "\n");
    if (stable) replace_file_atomic(dir_ / "STABLE", name + "\n");
    log::info("ckpt", "saved {}{} ({:.1f} MB in {:.2f} s)", (dir_ / name).string(),
              stable ? " (stable)" : "", total_bytes / 1e6, seconds_since(t0));
    apply_retention();
  }
  if (world_size_ > 1) barrier_();  // #3: committed; no rank runs ahead of the rename
}

}  // namespace keel::checkpoint
