// Atomic, verified, complete checkpoints (DESIGN.md, "Run directory"):
//
//   CHECKPOINTS/step_00001000/            a committed checkpoint (readers never see a partial one)
//     model.safetensors                   rank 0: weights (Hugging Face-loadable)
//     model.rank{r}.safetensors           ZeRO-3, instead: rank r's part of the weights, pieces
//                                         named by parameter and position (weight_parts.h)
//     optimizer.rank{r}.safetensors       rank r: its fp32 optimizer state
//     extra.rank{r}.safetensors           rank r: RNG states, loss scaler, ... (uint8 etc. tensors)
//     files.rank{r}.json                  rank r > 0 only: sizes + checksums of its files
//     trainer_state.json                  rank 0: step, schedule, data position, guard, counters
//     config.yaml                         rank 0: the resolved config
//     MANIFEST.json                       rank 0, written last: every file with size and xxh3-64,
//                                         keel version, config hash, step, world size, stable flag
//   CHECKPOINTS/LATEST, STABLE            one line naming the newest committed / stable checkpoint
//
// Commit protocol (save): files are written into step_N.tmp-<pid>, each fsynced, MANIFEST last,
// the directory fsynced, renamed to step_N, the parent fsynced; only then are LATEST (and STABLE)
// replaced (temp file + fsync + rename). Any write error (ENOSPC, EIO, ...) throws CheckpointError
// naming the file, removes the temporary directory and leaves earlier checkpoints and pointers as
// they were. Saving a step that already exists replaces it atomically (rename exchange).
//
// Multi-rank (world_size > 1): all ranks share one staging directory. rank 0 creates it, then
// barrier(); every rank writes its files (ranks > 0 also files.rank{r}.json); barrier(); rank 0
// folds files.rank*.json into MANIFEST, commits and updates the pointers; barrier(). So rank 0
// renames only after every rank finished. The barrier must be a collective every rank reaches,
// with a timeout (a failed rank otherwise leaves the others waiting). In async mode it is called
// from the writer thread: use an out-of-band barrier (c10d Store), not the training process group.
// The staging name carries rank 0's pid; stale-directory detection (kill(pid, 0)) is per host.
//
// Retention (rank 0, after each save and promotion): the newest checkpoint.keep_last non-stable
// plus the newest stable.keep stable checkpoints stay, and whatever LATEST or STABLE names;
// "newest" means most recently written (MANIFEST created time), so after a rollback the abandoned
// trajectory ages out instead of crowding out new checkpoints. keep_last <= 0 keeps everything.
// Leftover *.tmp-<pid> entries of dead processes are removed (construction and each save).
//
// Thread-safety: one Checkpointer is used from one thread. The async writer thread is internal;
// every method other than last_stall_seconds() first waits for it.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "config/schema.h"

namespace keel::checkpoint {

// What a checkpoint holds. Tensors may live on any device; they are read back on CPU.
struct CheckpointData {
  std::map<std::string, torch::Tensor> model;  // whole by name, or a rank's parts (weight_parts.h)
  bool model_in_parts = false;                 // every rank writes its part of the weights (ZeRO-3)
  std::map<std::string, torch::Tensor> optimizer;      // this rank's (or every rank's part)
  std::map<std::string, torch::Tensor> extra_tensors;  // RNG states (uint8), loss-scaler state, ...
  nlohmann::json trainer_state;  // step, schedule, data position, guard state, counters (opaque)
  std::string config_yaml;
};

struct ManifestFile {
  uint64_t size = 0;
  std::string xxh3;  // 16 lowercase hex digits
};

struct Manifest {
  int64_t step = 0;
  int world_size = 1;
  bool stable = false;
  bool optimizer_sharded = false;  // ZeRO-1: optimizer.rank{r} holds rank r's part of the state
  std::string keel_version;
  std::string config_hash;
  std::string created;          // UTC, ISO 8601
  int64_t created_unix_ns = 0;  // orders checkpoints by write time
  std::map<std::string, ManifestFile> files;
};

struct VerifyResult {
  bool ok = false;
  std::string problem;  // empty when ok; otherwise names the file and what is wrong
};

// "step_00001000" (at least 8 digits).
std::string step_dir_name(int64_t step);

// checkpoint.every_steps: auto. The interval at which a save that stalls training
// `stall_seconds` costs at most `max_overhead` of training time at `step_seconds` a step, rounded
// up to a round number (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k) so that runs on one machine agree,
// at least kMinAutoInterval, and at most max_steps / kMinAutoCheckpoints so that even a short run
// has snapshots to fall back to.
inline constexpr int64_t kMinAutoInterval = 10;
// A run times its own step attempts from the kCadenceStartStep-th (caches and allocators warm) to
// the kCadenceProbeStep-th, when it decides the auto interval.
inline constexpr int64_t kCadenceStartStep = 2;
inline constexpr int64_t kCadenceProbeStep = 12;
inline constexpr int64_t kMinAutoCheckpoints = 8;
int64_t auto_interval(double stall_seconds, double step_seconds, double max_overhead,
                      int64_t max_steps);
// The share of training time saves every `interval` steps cost: stall / (interval x step time).
// Above max_overhead where auto_interval's clamps (kMinAutoCheckpoints, kMinAutoInterval) won.
double checkpoint_overhead(double stall_seconds, double step_seconds, int64_t interval);
// checkpoint.stable.every_steps for a checkpoint interval: auto and 0 = every checkpoint.
int64_t stable_interval(const config::CheckpointConfig& cfg, int64_t checkpoint_interval);
// checkpoint.stable.window for a checkpoint interval: auto = the interval (the steps since the
// previous checkpoint must have passed without an alarm).
int64_t stable_window(const config::CheckpointConfig& cfg, int64_t checkpoint_interval);

// Parses DIR/MANIFEST.json; throws CheckpointError naming it when missing or malformed.
Manifest read_manifest(const std::filesystem::path& dir);

// Checks MANIFEST, then every listed file's existence, size and xxh3. Reads every byte.
VerifyResult verify_checkpoint(const std::filesystem::path& dir);

// The two pointers a checkpoints directory keeps: LATEST (the newest checkpoint) and STABLE (the
// newest stable snapshot).
enum class Pointer { kLatest, kStable };
const char* name_of(Pointer which);  // "latest" | "stable"

// The checkpoint `which` names in `checkpoints_dir`: the pointer's target if it verifies;
// otherwise (pointer missing, dangling or target corrupt) the most recently written step_* that
// verifies (for kStable: that is also stable), with a warning naming what failed and what is used.
// nullopt when there is none.
std::optional<std::filesystem::path> resolve_checkpoint(
    const std::filesystem::path& checkpoints_dir, Pointer which);

// A directory the user named: a checkpoint (step_N), or a run's checkpoints directory (its
// latest). Returned if it verifies; otherwise (missing, corrupt, holding none) CheckpointError —
// the user named it, so silently using another one would be wrong.
std::filesystem::path resolve_named_checkpoint(const std::filesystem::path& dir);

// The trainer_state.json of a checkpoint (its checksum verified), without reading the tensors.
nlohmann::json read_trainer_state(const std::filesystem::path& dir);

// Verifies the files this rank needs (MANIFEST, model, trainer_state, config, this rank's
// optimizer/extra) while reading them, in one pass; CheckpointError names the failing file.
// A run at another world size than the writer's reads rank (rank % writer's world size)'s files:
// the optimizer state is whole on every rank (not sharded), so any copy serves.
CheckpointData load_checkpoint(const std::filesystem::path& dir, int rank = 0, int world_size = 1);
// Every rank's optimizer part of a sharded checkpoint, keyed "rank{r}/...", verified: what a rank
// needs when its own part does not cover what it owns now (another zero level at the same world
// size, or no ZeRO).
std::map<std::string, torch::Tensor> load_optimizer_parts(const std::filesystem::path& dir);
// Every rank's part of a ZeRO-3 checkpoint's weights, merged (load_checkpoint gives this rank's
// own part at the same world size).
std::map<std::string, torch::Tensor> load_model_parts(const std::filesystem::path& dir);
// A checkpoint's weights alone, verified: model.safetensors, or every rank's part merged (put
// them together with weight_parts.h's whole_weights).
std::map<std::string, torch::Tensor> load_model(const std::filesystem::path& dir);

// Small file `name` of checkpoint `dir` (config.yaml, trainer_state.json), read and checked
// against its MANIFEST.json `m` in one pass.
std::string load_text(const std::filesystem::path& dir, const Manifest& m, const std::string& name);
// Checks file `name` of checkpoint `dir` against its MANIFEST.json `m` (listed, size, xxh3),
// streaming it through the hash and keeping nothing: for readers that then read parts of it.
void verify_file(const std::filesystem::path& dir, const Manifest& m, const std::string& name);

struct LoadedCheckpoint {
  std::filesystem::path path;
  CheckpointData data;
  bool from_memory = false;  // a copy the Checkpointer held, not read from the disk
};

// The first candidate resolve_checkpoint(checkpoints_dir, which) would consider that loads, read
// (and so verified) once, of step `at_most` or earlier when given. nullopt when there is none.
// Reads only: a start checks what it would resume from before it writes anything.
std::optional<LoadedCheckpoint> load_newest_checkpoint(
    const std::filesystem::path& checkpoints_dir, Pointer which, int rank = 0, int world_size = 1,
    std::optional<int64_t> at_most = std::nullopt);
// The most recently written checkpoint whose MANIFEST reads (not verified further), if any.
std::optional<std::filesystem::path> newest_written_checkpoint(
    const std::filesystem::path& checkpoints_dir);

class Checkpointer {
 public:
  using Barrier = std::function<void()>;

  // `checkpoints_dir` is created if absent. `config_hash` and `keel_version` go into MANIFEST.
  Checkpointer(std::filesystem::path checkpoints_dir, const config::CheckpointConfig& cfg, int rank,
               int world_size, std::string keel_version, std::string config_hash,
               Barrier barrier = {});
  // Waits for an in-flight async save; its error is logged, not thrown.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Saves `data` as step_N (step >= 0) and returns its final path. Sync: returns once committed.
  // Async (checkpoint.async): waits for the previous save (rethrowing its error), copies the
  // tensors to CPU, returns; a background thread writes and commits. Errors: CheckpointError.
  std::filesystem::path save(int64_t step, CheckpointData data, bool stable = false);

  // Blocks until no save is in flight; rethrows the error of a failed background save (once).
  void wait();

  // Seconds the last save() blocked its caller (sync: the whole save; async: waiting for the
  // previous save + copying tensors). last_write_seconds: wall time the last finished write took
  // (in async mode, on the background thread).
  double last_stall_seconds() const { return last_stall_s_; }
  double last_write_seconds() const { return last_write_s_; }

  // Marks an existing checkpoint stable: rewrites its MANIFEST atomically, points STABLE at it,
  // applies retention. rank 0 does the work; other ranks return at once.
  void promote_to_stable(int64_t step);

  // Keeps copies of the newest stable snapshot and of the newest checkpoint (which may be promoted
  // to one) in host memory, as long as together they take at most `bytes` (0: none kept).
  // load_newest(kStable) then returns the copy of the snapshot STABLE names instead of reading it.
  void set_memory_limit(uint64_t bytes);

  // See resolve_checkpoint / load_checkpoint; these wait for an in-flight save first.
  std::optional<std::filesystem::path> resolve(Pointer which);
  CheckpointData load(const std::filesystem::path& dir);
  // The first candidate resolve(which) would consider that loads, read (and so verified) once — a
  // rollback does not hash the snapshot twice at its worst moment. `at_most`: of that step or
  // earlier (a back-off goes back to before the trouble began).
  std::optional<LoadedCheckpoint> load_newest(Pointer which,
                                              std::optional<int64_t> at_most = std::nullopt);

  // A stable snapshot retention keeps besides its counts (the one a schedule back-off would
  // restore, while it may come), or none. Takes effect at the next save or promotion.
  void keep_also(std::optional<int64_t> step) {
    if (step == kept_) return;
    wait();  // the async writer applies retention
    kept_ = step;
  }

  // Moves every checkpoint newer than `step` (an abandoned timeline: the run went back to the
  // snapshot at `step`) into dir()/abandoned/<UTC time>-after-step_N/, so the new timeline's saves
  // of the same step numbers never replace them and the state before the trouble can still be
  // examined; LATEST then names step_N. Retention keeps the newest kKeepAbandoned timelines.
  // Returns the folder (empty when nothing was newer). rank 0 does the work.
  std::filesystem::path abandon_after(int64_t step);
  // The most recently written checkpoint whose MANIFEST reads (not verified further), if any.
  std::optional<std::filesystem::path> newest_written();
  static constexpr int kKeepAbandoned = 2;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  void write_checkpoint(int64_t step, const CheckpointData& data, bool stable);
  std::filesystem::path staging_dir(const std::string& name);
  uint64_t write_rank_files(const std::filesystem::path& staging, int64_t step,
                            const CheckpointData& data, nlohmann::ordered_json& files);
  uint64_t commit(const std::filesystem::path& staging, int64_t step, bool stable,
                  bool optimizer_sharded, nlohmann::ordered_json files, uint64_t total_bytes);
  void apply_retention();
  void remove_stale_tmp();

  std::filesystem::path dir_;
  config::CheckpointConfig cfg_;
  int rank_;
  int world_size_;
  std::string keel_version_;
  std::string config_hash_;
  Barrier barrier_;

  // A checkpoint's data kept in host memory (set_memory_limit): never modified, handed out as
  // copies.
  struct Held {
    int64_t step = -1;
    std::filesystem::path path;
    CheckpointData data;
    uint64_t bytes = 0;
  };
  void hold(int64_t step, const CheckpointData& data, bool stable, bool copy);
  std::optional<LoadedCheckpoint> held_stable(std::optional<int64_t> at_most) const;
  uint64_t memory_limit_ = 0;
  Held candidate_;    // the newest checkpoint, while it may still be promoted
  Held stable_held_;  // the newest stable snapshot

  std::optional<int64_t> kept_;  // keep_also()
  std::thread writer_;           // the in-flight async save, if joinable
  std::exception_ptr writer_error_;
  double last_stall_s_ = 0.0;
  std::atomic<double> last_write_s_{0.0};  // set by whichever thread wrote
};

}  // namespace keel::checkpoint
