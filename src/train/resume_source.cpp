#include "train/resume_source.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"
#include "common/spelling.h"
#include "config/fields.h"
#include "config/load.h"

namespace keel::train {
namespace fs = std::filesystem;
namespace {

// Flattens a config into key -> printed value, to name exactly which keys differ.
struct Flatten {
  std::map<std::string, std::string> out;
  std::string prefix;
  template <class T>
  void field(const char* key, T& value) {
    std::ostringstream s;
    if constexpr (std::is_same_v<T, std::vector<double>> ||
                  std::is_same_v<T, std::vector<std::string>>) {
      for (auto& v : value) s << v << ",";
    } else if constexpr (config::Choice<T>) {
      s << config::name_of(value);
    } else {
      s << value;
    }
    out[prefix + key] = s.str();
  }
  void field(const char* key, int64_t& value, config::AutoAllowed) { field(key, value); }
  template <class S>
  void section(const char* key, S& sub) {
    std::string saved = prefix;
    prefix += std::string(key) + ".";
    config::visit(*this, sub);
    prefix = saved;
  }
  template <class S>
  void list(const char*, std::vector<S>&) {}
};

std::map<std::string, std::string> flatten(config::Config c) {
  Flatten f;
  config::visit(f, c);
  return f.out;
}

// Keys a resumed run cannot change: the model's shape and the identity of its data stream.
bool must_match(const std::string& key) {
  static const std::vector<std::string> kExact = {
      "data.source", "data.path", "data.synthetic_branching", "data.synthetic_zipf", "run.seed"};
  // How the model computes is free to change (a resume after running out of memory turns these
  // on); what it is, is not.
  static const std::vector<std::string> kHow = {"model.chunked_loss",
                                                "model.activation_checkpointing"};
  if (std::find(kHow.begin(), kHow.end(), key) != kHow.end()) return false;
  return key.rfind("model.", 0) == 0 ||
         std::find(kExact.begin(), kExact.end(), key) != kExact.end();
}

}  // namespace

std::string ResumeRequest::name() const {
  switch (kind) {
    case Kind::kNone:
      return "";
    case Kind::kLatest:
      return "latest";
    case Kind::kStable:
      return "stable";
    case Kind::kPath:
      return path.string();
  }
  return "";
}

ResumeRequest ResumeRequest::parse(const std::string& value) {
  ResumeRequest r;
  if (value.empty()) return r;
  if (value == "latest") {
    r.kind = Kind::kLatest;
    return r;
  }
  if (value == "stable") {
    r.kind = Kind::kStable;
    return r;
  }
  std::error_code ec;
  if (fs::is_directory(value, ec)) {
    r.kind = Kind::kPath;
    r.path = value;
    return r;
  }
  std::string message = "--resume " + value + ": ";
  const bool exists = fs::exists(value, ec);
  if (auto near = closest_word(value, {"latest", "stable"}); near && !exists) {
    message += "not latest, stable or a checkpoint directory (did you mean " + *near + "?)";
  } else if (exists) {
    message +=
        "not a directory; give latest, stable, or a checkpoint directory (step_N) or a "
        "run's checkpoints directory";
  } else {
    message += "no such directory" + relative_note(value);
    message +=
        "; give latest, stable, or a checkpoint directory (step_N) or a run's checkpoints "
        "directory";
  }
  throw UserError(message);
}

std::optional<ResumeSource> find_resume_source(const fs::path& checkpoints_dir,
                                               const std::string& run_dir,
                                               const ResumeRequest& request, int rank,
                                               int world_size) {
  using Kind = ResumeRequest::Kind;
  if (!request.requested()) return std::nullopt;
  ResumeSource source;
  if (request.kind == Kind::kPath) {
    source.path = checkpoint::resolve_named_checkpoint(request.path);
    source.data = checkpoint::load_checkpoint(source.path, rank, world_size);
    source.mode = request.path.string();
    return source;
  }
  using checkpoint::Pointer;
  Pointer which = request.kind == Kind::kStable ? Pointer::kStable : Pointer::kLatest;
  // A restart loop that meets the same crash again: twice dead at one step since the newest
  // checkpoint means resuming from it would die a third time.
  if (request.kind == Kind::kLatest) {
    if (auto newest = checkpoint::newest_written_checkpoint(checkpoints_dir)) {
      const int64_t newest_step = checkpoint::read_manifest(*newest).step;
      source.crash = crash_loop_after(read_abnormal_ends(run_dir), newest_step);
      if (source.crash &&
          !checkpoint::resolve_checkpoint(checkpoints_dir, checkpoint::Pointer::kStable)) {
        log::warn("ckpt",
                  "the run ended abnormally twice at step {} since checkpoint step {}, but there "
                  "is no stable snapshot to fall back to: resuming from the newest checkpoint",
                  source.crash->step, newest_step);
        source.crash.reset();
      }
      if (source.crash) {
        log::warn("ckpt",
                  "the run ended abnormally twice at step {} since checkpoint step {}: resuming "
                  "from the newest stable snapshot instead, as a recovery",
                  source.crash->step, newest_step);
        which = Pointer::kStable;
      }
    }
  }
  auto loaded = checkpoint::load_newest_checkpoint(checkpoints_dir, which, rank, world_size);
  if (!loaded) {
    log::info("ckpt", "no {} checkpoint in {} yet: starting fresh", checkpoint::name_of(which),
              checkpoints_dir.string());
    return std::nullopt;
  }
  source.path = loaded->path;
  source.data = std::move(loaded->data);
  source.pointer = which;
  source.mode = checkpoint::name_of(which);
  return source;
}

void check_resumable(const config::Config& cfg, const ResumeSource& source) {
  auto stored = config::load_config_from_string(source.data.config_yaml,
                                                (source.path / "config.yaml").string());
  auto before = flatten(stored.config), now = flatten(cfg);
  std::string list;
  for (const auto& [key, value] : now)
    if (must_match(key) && before[key] != value)
      list += "\n  " + key + " (checkpoint: " + before[key] + ", now: " + value + ")";
  if (!list.empty())
    throw ConfigError("cannot resume from " + source.path.string() +
                      ": the config changes what a resume cannot honour:" + list +
                      "\nHINT: resume with the checkpoint's values, or start a new run in another "
                      "--run-dir");
}

}  // namespace keel::train
