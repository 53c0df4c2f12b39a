#include "checkpoint/checkpointer.h"

#include <fcntl.h>  // AT_FDCWD
#include <fmt/format.h>
#include <signal.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include "checkpoint/file_io.h"
#include "checkpoint/layout.h"
#include "checkpoint/snapshot.h"
#include "checkpoint/tensor_file.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"

namespace keel::checkpoint {

namespace fs = std::filesystem;
using namespace internal;

namespace {

// step_<digits>, nothing else: temporary and deleted directories never parse as checkpoints.
std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    if (__builtin_mul_overflow(step, 10, &step) ||
        __builtin_add_overflow(step, name[i] - '0', &step))
      return std::nullopt;
  }
  return step;
}

struct Entry {
  fs::path path;
  std::string name;
  int64_t step = 0;
  int64_t created_ns = 0;
  bool stable = false;
  bool manifest_ok = false;
};

int64_t mtime_ns(const fs::path& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Committed checkpoints, most recently written first.
std::vector<Entry> list_checkpoints(const fs::path& dir) {
  std::vector<Entry> out;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    std::string name = de.path().filename().string();
    auto step = parse_step_dir(name);
    if (!step || !de.is_directory()) continue;
    Entry e{de.path(), name, *step};
    try {
      Manifest m = read_manifest(de.path());
      e.created_ns = m.created_unix_ns;
      e.stable = m.stable;
      e.manifest_ok = true;
    } catch (const CheckpointError&) {
      e.created_ns = mtime_ns(de.path());
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.created_ns != b.created_ns ? a.created_ns > b.created_ns : a.step > b.step;
  });
  return out;
}

// The directory name a pointer file holds, if the file exists and is not empty.
std::optional<std::string> read_pointer(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  std::string s;
  try {
    s = read_file(file);
  } catch (const CheckpointError&) {
    return std::nullopt;
  }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  if (s.empty()) return std::nullopt;
  return s;
}

[[noreturn]] void checksum_mismatch(const fs::path& p, const std::string& actual,
                                    const std::string& expected) {
  throw CheckpointError(p.string() + ": checksum mismatch (xxh3 " + actual + ", " + kManifest +
                        " says " + expected +
                        "): the file is corrupt\nHINT: resume from another checkpoint "
                        "(--resume latest falls back to the newest one that verifies)");
}

// Compares a digest with the manifest's entry for `name`; throws naming the file.
void check_digest(const fs::path& dir, const Manifest& m, const std::string& name,
                  const FileDigest& d) {
  const ManifestFile& f = m.files.at(name);
  if (d.size != f.size)
    throw CheckpointError((dir / name).string() + ": " + std::to_string(d.size) + " bytes, " +
                          kManifest + " says " + std::to_string(f.size) + " (truncated?)");
  if (xxh3_hex(d.xxh3) != f.xxh3) checksum_mismatch(dir / name, xxh3_hex(d.xxh3), f.xxh3);
}

const ManifestFile& listed(const fs::path& dir, const Manifest& m, const std::string& name) {
  auto it = m.files.find(name);
  if (it == m.files.end())
    throw CheckpointError((dir / kManifest).string() + ": does not list " + name);
  return it->second;
}

// Reads a safetensors file of the checkpoint, checking its checksum in the same pass. When the
// file does not even parse, the checksum decides the message: corruption is the likelier cause.
TensorMap load_tensors(const fs::path& dir, const Manifest& m, const std::string& name) {
  const ManifestFile& f = listed(dir, m, name);
  FileDigest d;
  SafetensorsContents c;
  try {
    c = read_safetensors(dir / name, &d);
  } catch (const CheckpointError&) {
    std::error_code ec;
    if (fs::exists(dir / name, ec)) {
      FileDigest actual = hash_file(dir / name);
      if (xxh3_hex(actual.xxh3) != f.xxh3)
        checksum_mismatch(dir / name, xxh3_hex(actual.xxh3), f.xxh3);
    }
    throw;
  }
  check_digest(dir, m, name, d);
  return std::move(c.tensors);
}

// For which = latest|stable: tries the pointer's target, then every other step_* newest first
// (for stable: only those marked stable), with `use`, and returns the first it accepts. `use`
// returns a VerifyResult; its problem is logged when a candidate is passed over.
// `at_most`: only checkpoints of that step or earlier (the pointer's target too), without a warning
// about the newer ones passed over.
template <class Use>
std::optional<fs::path> first_usable(const fs::path& checkpoints_dir, Pointer which, Use use,
                                     std::optional<int64_t> at_most = std::nullopt) {
  const bool want_stable = which == Pointer::kStable;
  const fs::path pointer = checkpoints_dir / (want_stable ? "STABLE" : "LATEST");
  const auto within = [&](int64_t step) { return !at_most || step <= *at_most; };
  std::string failure;
  fs::path named;
  const auto target = read_pointer(pointer);
  // A target past `at_most` is passed over, not a failure.
  const bool beyond = target && !within(parse_step_dir(*target).value_or(0));
  if (target && !beyond) {
    named = checkpoints_dir / *target;
    std::error_code ec;
    if (!fs::is_directory(named, ec)) {
      failure = pointer.string() + " names " + *target + ", which does not exist";
    } else {
      VerifyResult v;
      try {
        v = want_stable && !read_manifest(named).stable
                ? VerifyResult{false, named.string() + " is not marked stable"}
                : use(named);
      } catch (const CheckpointError& e) {
        v = {false, e.what()};
      }
      if (v.ok) return named;
      failure = v.problem;
    }
  } else if (!beyond) {
    failure = pointer.string() + " is missing";
  }

  std::vector<Entry> candidates;
  for (auto& c : list_checkpoints(checkpoints_dir))
    if (c.path != named && (!want_stable || (c.manifest_ok && c.stable)) && within(c.step))
      candidates.push_back(c);
  if (candidates.empty() && named.empty()) return std::nullopt;  // a fresh directory: no news
  const char* kind = want_stable ? "stable " : "";
  if (!failure.empty())
    log::warn("ckpt", "{}; falling back to the newest {}checkpoint that verifies", failure, kind);
  for (const auto& c : candidates) {
    VerifyResult v = use(c.path);
    if (v.ok) {
      if (!failure.empty()) log::warn("ckpt", "using {}", c.path.string());
      return c.path;
    }
    log::warn("ckpt", "skipping {}: {}", c.path.string(), v.problem);
  }
  log::warn("ckpt", "no {}checkpoint in {} verifies", kind, checkpoints_dir.string());
  return std::nullopt;
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

Manifest read_manifest(const fs::path& dir) {
  fs::path p = dir / kManifest;
  std::error_code ec;
  if (!fs::exists(p, ec))
    throw CheckpointError(p.string() +
                          ": missing (not a checkpoint, or one whose save did not finish)");
  std::string text = read_file(p);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw CheckpointError(p.string() + ": not valid JSON (the manifest is corrupt)");
  Manifest m;
  try {
    if (j.value("format", std::string()) != kFormat)
      throw CheckpointError(p.string() + ": \"format\" is not \"" + kFormat + "\"");
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.stable = j.at("stable").get<bool>();
    m.optimizer_sharded = j.value("optimizer_sharded", false);
    m.keel_version = j.value("keel_version", std::string());
    m.config_hash = j.value("config_hash", std::string());
    m.created = j.value("created", std::string());
    m.created_unix_ns = j.value("created_unix_ns", int64_t{0});
    for (const auto& [name, f] : j.at("files").items()) {
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw CheckpointError(p.string() + ": file name '" + name + "' is not a plain name");
      m.files[name] = {f.at("size").get<uint64_t>(), f.at("xxh3").get<std::string>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(p.string() + ": malformed manifest: " + e.what());
  }
  return m;
}

VerifyResult verify_checkpoint(const fs::path& dir) {
  Manifest m;
  try {
    m = read_manifest(dir);
  } catch (const CheckpointError& e) {
    return {false, e.what()};
  }
  // The weights whole (model.safetensors) or in every rank's part (ZeRO-3).
  const bool parts =
      !m.files.count("model.safetensors") && m.files.count(rank_file("model", 0, "safetensors"));
  std::vector<std::string> required = {
      parts ? rank_file("model", 0, "safetensors") : "model.safetensors", "trainer_state.json"};
  for (int r = 0; r < m.world_size; ++r) {
    required.push_back(rank_file("optimizer", r, "safetensors"));
    if (parts) required.push_back(rank_file("model", r, "safetensors"));
  }
  for (const auto& name : required)
    if (!m.files.count(name))
      return {false, (dir / kManifest).string() + ": does not list " + name};
  for (const auto& [name, f] : m.files) {
    fs::path p = dir / name;
    std::error_code ec;
    auto size = fs::file_size(p, ec);
    if (ec) return {false, p.string() + ": missing (" + ec.message() + ")"};
    if (size != f.size)
      return {false, p.string() + ": " + std::to_string(size) + " bytes, " + kManifest + " says " +
                         std::to_string(f.size) + " (truncated?)"};
    try {
      FileDigest d = hash_file(p);
      if (xxh3_hex(d.xxh3) != f.xxh3)
        return {false, p.string() + ": checksum mismatch (xxh3 " + xxh3_hex(d.xxh3) + ", " +
                           kManifest + " says " + f.xxh3 + "): the file is corrupt"};
    } catch (const CheckpointError& e) {
      return {false, e.what()};
    }
  }
  return {true, ""};
}

const char* name_of(Pointer which) { return which == Pointer::kStable ? "stable" : "latest"; }

std::optional<fs::path> resolve_checkpoint(const fs::path& checkpoints_dir, Pointer which) {
  return first_usable(checkpoints_dir, which,
                      [](const fs::path& dir) { return verify_checkpoint(dir); });
}

fs::path resolve_named_checkpoint(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_directory(p, ec))
    throw CheckpointError(p.string() + ": no such checkpoint directory" + relative_note(p));
  // A checkpoints directory (holds LATEST or step_*), not a checkpoint: take its latest.
  if (!fs::exists(p / kManifest, ec) &&
      (fs::exists(p / "LATEST", ec) || !list_checkpoints(p).empty())) {
    auto r = resolve_checkpoint(p, Pointer::kLatest);
    if (!r) throw CheckpointError(p.string() + ": holds no checkpoint that verifies");
    return *r;
  }
  VerifyResult v = verify_checkpoint(p);
  if (!v.ok)
    throw CheckpointError(
        v.problem + "\nHINT: --resume latest falls back to the newest checkpoint that verifies");
  return p;
}

nlohmann::json read_trainer_state(const fs::path& dir) {
  Manifest m = read_manifest(dir);
  auto state = nlohmann::json::parse(load_text(dir, m, "trainer_state.json"), nullptr, false);
  if (state.is_discarded())
    throw CheckpointError((dir / "trainer_state.json").string() + ": not valid JSON");
  return state;
}

CheckpointData load_checkpoint(const fs::path& dir, int rank, int world_size) {
  Manifest m = read_manifest(dir);
  // Without sharding every rank holds the whole optimizer state, so a run at another world size
  // reads any rank's copy; sharded (ZeRO-1/2/3) at another world size, it gets every rank's part,
  // keyed "rank{r}/...", and takes what it owns now. A ZeRO-3 checkpoint's weights likewise: this
  // rank's part at the same world size, every part merged at another (the trainer reads every
  // part when its own does not cover what it owns: load_optimizer_parts, load_model_parts). RNG
  // and loss-scaler state come from the rank of the same number modulo the writer's world size
  // (a resume at another world size is not bit-exact; the data order is).
  const int source = rank % m.world_size;
  CheckpointData d;
  const bool model_in_parts = !m.files.count("model.safetensors");
  d.model = model_in_parts && m.world_size == world_size
                ? load_tensors(dir, m, rank_file("model", rank, "safetensors"))  // its own part
                : load_model(dir);
  if (m.optimizer_sharded && m.world_size != world_size) {
    d.optimizer = load_optimizer_parts(dir);
  } else {
    d.optimizer = load_tensors(dir, m, rank_file("optimizer", source, "safetensors"));
  }
  std::string extra = rank_file("extra", source, "safetensors");
  if (m.files.count(extra)) d.extra_tensors = load_tensors(dir, m, extra);
  std::string state = load_text(dir, m, "trainer_state.json");
  d.trainer_state = nlohmann::json::parse(state, nullptr, false);
  if (d.trainer_state.is_discarded())
    throw CheckpointError((dir / "trainer_state.json").string() + ": not valid JSON");
  if (m.files.count("config.yaml")) d.config_yaml = load_text(dir, m, "config.yaml");
  return d;
}

// Every rank's STEM.rank{r}.safetensors, merged; keyed "rank{r}/..." when `by_rank`.
static std::map<std::string, torch::Tensor> load_every_rank(const fs::path& dir, const char* stem,
                                                            bool by_rank) {
  const Manifest m = read_manifest(dir);
  std::map<std::string, torch::Tensor> out;
  for (int r = 0; r < m.world_size; ++r)
    for (auto& [k, v] : load_tensors(dir, m, rank_file(stem, r, "safetensors")))
      out[by_rank ? "rank" + std::to_string(r) + "/" + k : k] = std::move(v);
  return out;
}

std::map<std::string, torch::Tensor> load_optimizer_parts(const fs::path& dir) {
  return load_every_rank(dir, "optimizer", /*by_rank=*/true);
}

std::map<std::string, torch::Tensor> load_model_parts(const fs::path& dir) {
  return load_every_rank(dir, "model", /*by_rank=*/false);  // piece keys are unique across ranks
}

std::string load_text(const fs::path& dir, const Manifest& m, const std::string& name) {
  listed(dir, m, name);
  std::string s = read_file(dir / name);
  check_digest(dir, m, name, {s.size(), XXH3_64bits(s.data(), s.size())});
  return s;
}

void verify_file(const fs::path& dir, const Manifest& m, const std::string& name) {
  listed(dir, m, name);
  check_digest(dir, m, name, hash_file(dir / name));
}

std::map<std::string, torch::Tensor> load_model(const fs::path& dir) {
  const Manifest m = read_manifest(dir);
  return m.files.count("model.safetensors") ? load_tensors(dir, m, "model.safetensors")
                                            : load_model_parts(dir);
}

Checkpointer::Checkpointer(fs::path checkpoints_dir, const config::CheckpointConfig& cfg, int rank,
                           int world_size, std::string keel_version, std::string config_hash,
                           Barrier barrier)
    : dir_(std::move(checkpoints_dir)),
      cfg_(cfg),
      rank_(rank),
      world_size_(world_size),
      keel_version_(std::move(keel_version)),
      config_hash_(std::move(config_hash)),
      barrier_(barrier ? std::move(barrier) : Barrier([] {})) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw CheckpointError(dir_.string() + ": cannot create checkpoint directory: " + ec.message());
  if (rank_ == 0) remove_stale_tmp();
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    log::error("ckpt", "background checkpoint save failed: {}", e.what());
  }
}

void Checkpointer::wait() {
  if (writer_.joinable()) writer_.join();
  if (writer_error_) {
    auto e = writer_error_;
    writer_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

fs::path Checkpointer::save(int64_t step, CheckpointData data, bool stable) {
  auto t0 = Clock::now();
  if (step < 0) throw CheckpointError("checkpoint step must be >= 0, got " + std::to_string(step));
  wait();
  fs::path final_dir = dir_ / step_dir_name(step);
  if (!cfg_.async) {
    hold(step, data, stable, /*copy=*/true);
    write_checkpoint(step, data, stable);
    last_stall_s_ = last_write_s_ = seconds_since(t0);
    return final_dir;
  }
  data.model = snapshot(data.model);
  data.optimizer = snapshot(data.optimizer);
  data.extra_tensors = snapshot(data.extra_tensors);
  hold(step, data, stable, /*copy=*/false);  // shares the writer's snapshot: both only read it
  writer_ = std::thread([this, step, stable, d = std::move(data)] {
    auto t1 = Clock::now();
    try {
      write_checkpoint(step, d, stable);
      last_write_s_ = seconds_since(t1);
    } catch (...) {
      writer_error_ = std::current_exception();
    }
  });
  last_stall_s_ = seconds_since(t0);
  return final_dir;
}

void Checkpointer::promote_to_stable(int64_t step) {
  wait();
  if (candidate_.step == step) {
    stable_held_ = std::move(candidate_);
    candidate_ = Held();
  }
  if (rank_ != 0) return;
  const std::string name = step_dir_name(step);
  const fs::path dir = dir_ / name;
  VerifyResult v = verify_checkpoint(dir);
  if (!v.ok) throw CheckpointError("cannot promote " + name + " to stable: " + v.problem);
  auto j = nlohmann::ordered_json::parse(read_file(dir / kManifest));
  j["stable"] = true;
  replace_file_atomic(dir / kManifest, j.dump(2) + "\n");
  replace_file_atomic(dir_ / "STABLE", name + "\n");
  log::info("ckpt", "promoted {} to stable", dir.string());
  apply_retention();
}

std::optional<fs::path> Checkpointer::resolve(Pointer which) {
  wait();
  return resolve_checkpoint(dir_, which);
}

CheckpointData Checkpointer::load(const fs::path& dir) {
  wait();
  return load_checkpoint(dir, rank_, world_size_);
}

std::optional<LoadedCheckpoint> load_newest_checkpoint(const fs::path& checkpoints_dir,
                                                       Pointer which, int rank, int world_size,
                                                       std::optional<int64_t> at_most) {
  std::optional<CheckpointData> data;
  auto path = first_usable(
      checkpoints_dir, which,
      [&](const fs::path& dir) -> VerifyResult {
        try {
          data = load_checkpoint(dir, rank, world_size);  // verifies what it reads, once
          return {true, ""};
        } catch (const CheckpointError& e) {
          return {false, e.what()};
        }
      },
      at_most);
  if (!path) return std::nullopt;
  return LoadedCheckpoint{*path, std::move(*data)};
}

std::optional<fs::path> newest_written_checkpoint(const fs::path& checkpoints_dir) {
  for (const auto& e : list_checkpoints(checkpoints_dir))
    if (e.manifest_ok) return e.path;
  return std::nullopt;
}

std::optional<LoadedCheckpoint> Checkpointer::load_newest(Pointer which,
                                                          std::optional<int64_t> at_most) {
  wait();
  if (which == Pointer::kStable)
    if (auto held = held_stable(at_most)) return held;
  return load_newest_checkpoint(dir_, which, rank_, world_size_, at_most);
}

std::optional<fs::path> Checkpointer::newest_written() {
  wait();
  return newest_written_checkpoint(dir_);
}

fs::path Checkpointer::abandon_after(int64_t step) {
  wait();
  if (rank_ != 0) return {};
  std::vector<Entry> newer;
  for (auto& e : list_checkpoints(dir_))
    if (e.step > step) newer.push_back(e);
  if (newer.empty()) return {};
  std::string stamp = utc_now_iso(std::chrono::system_clock::now());
  std::replace(stamp.begin(), stamp.end(), ':', '-');
  fs::path timeline = dir_ / "abandoned" / (stamp + "-after-" + step_dir_name(step));
  for (int n = 2; fs::exists(timeline); ++n)
    timeline =
        dir_ / "abandoned" / (stamp + "-after-" + step_dir_name(step) + "-" + std::to_string(n));
  std::error_code ec;
  fs::create_directories(timeline, ec);
  if (ec) throw CheckpointError(timeline.string() + ": cannot create: " + ec.message());
  for (const auto& e : newer)
    if (::rename(e.path.c_str(), (timeline / e.name).c_str()) != 0)
      throw CheckpointError("cannot move " + e.path.string() + " to " + timeline.string() + ": " +
                            std::strerror(errno));
  fsync_dir(timeline);
  if (fs::is_directory(dir_ / step_dir_name(step)))
    replace_file_atomic(dir_ / "LATEST", step_dir_name(step) + "\n");
  fsync_dir(dir_);
  log::warn("ckpt", "moved {} checkpoint(s) of the abandoned timeline after step {} to {}",
            newer.size(), step, timeline.string());
  // Retention: the newest kKeepAbandoned timelines stay (their names sort by time).
  std::vector<fs::path> timelines;
  for (const auto& de : fs::directory_iterator(dir_ / "abandoned", ec))
    if (de.is_directory() && de.path().filename().string().find(".tmp-") == std::string::npos)
      timelines.push_back(de.path());
  std::sort(timelines.begin(), timelines.end());
  for (size_t i = 0; i + kKeepAbandoned < timelines.size(); ++i) remove_quietly(timelines[i]);
  return timeline;
}

void Checkpointer::apply_retention() {
  auto entries = list_checkpoints(dir_);
  auto latest = read_pointer(dir_ / "LATEST");
  auto stable_ptr = read_pointer(dir_ / "STABLE");
  int64_t ordinary = 0, stable = 0;
  for (const auto& e : entries) {
    bool keep = (latest && *latest == e.name) || (stable_ptr && *stable_ptr == e.name) ||
                (kept_ && *kept_ == e.step && e.stable);
    if (e.stable)
      keep |= cfg_.stable.keep <= 0 || stable++ < cfg_.stable.keep;
    else
      keep |= cfg_.keep_last <= 0 || ordinary++ < cfg_.keep_last;
    if (keep) continue;
    // Rename first: a deletion cut short leaves a *.tmp-<pid> (cleaned later), never a step_N
    // with files missing.
    fs::path doomed = dir_ / (e.name + ".del.tmp-" + std::to_string(::getpid()));
    if (::rename(e.path.c_str(), doomed.c_str()) != 0) {
      log::warn("ckpt", "retention: could not remove {}: {}", e.path.string(),
                std::strerror(errno));
      continue;
    }
    remove_quietly(doomed);
  }
  remove_stale_tmp();
}

void Checkpointer::remove_stale_tmp() {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    // Our own pid: nothing of ours is in flight when this runs (saves are serialized).
    if (is_stale_tmp(de.path().filename().string())) stale.push_back(de.path());
  }
  for (const auto& p : stale) {
    log::info("ckpt", "removing leftover {}", p.string());
    remove_quietly(p);
  }
}

}  // namespace keel::checkpoint
