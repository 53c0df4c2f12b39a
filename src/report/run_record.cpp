// load_run: the run directory's files into a RunRecord. Every reader tolerates what a live or a
// crashed run leaves behind — a half-written last line, a file not created yet — and says what it
// skipped in RunRecord::notes instead of failing: the report is most wanted when a run went wrong.
#include <fmt/format.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include "common/error.h"
#include "common/event_kind.h"
#include "common/paths.h"
#include "common/quarantine_reason.h"
#include "report/report.h"
#include "report/svg.h"

namespace keel::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A heartbeat younger than this means a process is still writing the run.
constexpr double kLiveHeartbeatS = 120;

// Per-layer and per-bucket maps in a metrics line: not plotted, and too many to hold for a long
// run.
bool skipped_metric(const std::string& key, const json& value) {
  return key == "grad_norm_layers" || key == "update_ratio_layers" || key == "bucket_mix" ||
         value.size() > 32;
}

std::optional<double> number(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::optional<int64_t> integer(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->is_number_integer() ? it->get<int64_t>() : static_cast<int64_t>(it->get<double>());
}

std::string string_or(const json& j, const char* key, const std::string& fallback = "") {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// Where a sample came from, for a person to open: its input record ("FILE:LINE id ID", from the
// loader's "source"), else its place in the shards ("SHARD @ OFFSET"); "" when neither is known.
std::string origin_of(const json& where) {
  if (!where.is_object()) return "";
  if (const auto s = where.find("source"); s != where.end() && s->is_object()) {
    std::string out = string_or(*s, "file");
    if (const auto line = integer(*s, "line")) out += ":" + std::to_string(*line);
    if (const auto id = s->find("id"); id != s->end() && id->is_string())
      out += " id " + id->get<std::string>();
    if (!out.empty()) return out;
  }
  if (const std::string shard = string_or(where, "shard"); !shard.empty())
    return shard + " @ " + std::to_string(integer(where, "offset").value_or(0));
  return "";
}

// Calls `use` with every line of `path` that is a JSON object; a line that is not, or that `use`
// refuses (returns false, or throws a json error), is counted in a note. A last line without its
// newline that does not parse is a write in progress (or cut short by a crash): its own note.
// Returns false when the file cannot be opened.
bool read_jsonl(const fs::path& path, const std::function<bool(const json&)>& use,
                std::vector<std::string>& notes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string line;
  int64_t number = 0, bad = 0, first_bad = 0;
  bool truncated = false;
  while (std::getline(in, line)) {
    ++number;
    const bool unterminated = in.eof();  // getline stopped at the end, not at a '\n'
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) j = json::parse(svg::repair_utf8(line), nullptr, false);
    bool ok = !j.is_discarded() && j.is_object();
    if (ok) {
      try {
        ok = use(j);
      } catch (const json::exception&) {
        ok = false;
      }
    }
    if (ok) continue;
    if (unterminated) {
      truncated = true;
    } else {
      ++bad;
      if (first_bad == 0) first_bad = number;
    }
  }
  const std::string name = path.filename().string();
  if (bad > 0)
    notes.push_back(fmt::format("{}: {} malformed line{} skipped (the first is line {})", name, bad,
                                bad == 1 ? "" : "s", first_bad));
  if (truncated)
    notes.push_back(fmt::format(
        "{}: the last line is incomplete (the run is writing it, or stopped mid-line): skipped",
        name));
  return true;
}

void read_metrics(const fs::path& path, RunRecord& run) {
  Metrics& m = run.metrics;
  auto put = [&m](const std::string& key, double v) {
    const size_t row = m.step.size();  // the row being read, not yet in m.step
    auto& column = m.columns[key];
    if (column.size() > row) {  // "a.b" twice in one line (a key and a flattened object)
      column[row] = v;
      return;
    }
    column.resize(row, kNaN);
    column.push_back(v);
  };
  const bool found = read_jsonl(
      path,
      [&](const json& j) {
        const auto step = integer(j, "step");
        if (!step) return false;
        for (const auto& [key, value] : j.items()) {
          if (key == "step") continue;
          if (value.is_number()) {
            put(key, value.get<double>());
          } else if (value.is_boolean()) {
            put(key, value.get<bool>() ? 1.0 : 0.0);
          } else if (value.is_object() && !skipped_metric(key, value)) {
            for (const auto& [sub, v] : value.items())
              if (v.is_number()) put(key + "." + sub, v.get<double>());
          }
        }
        m.step.push_back(*step);
        return true;
      },
      run.notes);
  if (!found) {
    run.notes.push_back("no metrics.jsonl: no step was logged, so there are no curves");
    return;
  }
  for (auto& [key, column] : m.columns) column.resize(m.size(), kNaN);
  // Abandoned: some later line went back to this step or before it.
  m.abandoned.assign(m.size(), false);
  int64_t later_min = std::numeric_limits<int64_t>::max();
  for (size_t i = m.size(); i-- > 0;) {
    m.abandoned[i] = later_min <= m.step[i];
    later_min = std::min(later_min, m.step[i]);
  }
  if (m.size() == 0) run.notes.push_back("metrics.jsonl is empty: no step was logged yet");
}

void read_events(const fs::path& path, RunRecord& run) {
  const bool found = read_jsonl(
      path,
      [&](const json& j) {
        const auto step = integer(j, "step");
        const std::string kind = string_or(j, "kind");
        if (!step || kind.empty()) return false;
        Event e;
        e.step = *step;
        e.kind = kind;
        e.iteration = integer(j, "iteration").value_or(-1);
        if (const auto it = j.find("detail"); it != j.end())
          e.detail = it->is_object() ? *it : json{{"value", *it}};
        run.events.push_back(std::move(e));
        return true;
      },
      run.notes);
  if (!found) run.notes.push_back("no events.jsonl: no event markers, incidents or run status");
}

void read_evals(const fs::path& path, RunRecord& run) {
  const bool found = read_jsonl(
      path,
      [&](const json& j) {
        const auto step = integer(j, "step");
        if (!step || !j.contains("val_loss")) return false;
        // A null val_loss is a non-finite eval: on record, but nothing to plot.
        if (const auto v = number(j, "val_loss"))
          run.evals.push_back({*step, *v, number(j, "floor")});
        return true;
      },
      run.notes);
  if (!found)
    run.notes.push_back("no eval.jsonl: no validation curve (eval.every_steps: 0, or no eval yet)");
}

// step_00000076 or step_00000076-iter81.
bool parse_forensics_name(const std::string& name, Forensics& f) {
  if (name.rfind("step_", 0) != 0) return false;
  size_t pos = 5, end = pos;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == pos) return false;
  f.step = std::stoll(name.substr(pos, end - pos));
  const std::string suffix = "-iter";
  if (name.compare(end, suffix.size(), suffix) == 0) {
    const std::string digits = name.substr(end + suffix.size());
    if (!digits.empty() &&
        std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
      f.iteration = std::stoll(digits);
  }
  return true;
}

std::optional<json> read_json_file(const fs::path& path, std::vector<std::string>& notes,
                                   const std::string& shown_as) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json j = json::parse(svg::repair_utf8(text), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    notes.push_back(shown_as + ": not valid JSON (written when the run stopped?): skipped");
    return std::nullopt;
  }
  return j;
}

void read_forensics(const fs::path& dir, RunRecord& run) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    Forensics f;
    f.name = it->path().filename().string();
    if (!it->is_directory(ec) || !parse_forensics_name(f.name, f)) continue;
    for (fs::directory_iterator file(it->path(), ec); !ec && file != end; file.increment(ec))
      f.files.push_back(file->path().filename().string());
    ec.clear();
    std::sort(f.files.begin(), f.files.end());
    const std::string shown = "forensics/" + f.name + "/";
    if (auto j = read_json_file(it->path() / "samples.json", run.notes, shown + "samples.json");
        j && j->is_array()) {
      for (const auto& s : *j) {
        if (!s.is_object()) continue;
        ForensicSample sample;
        sample.id = integer(s, "sample_id").value_or(integer(s, "id").value_or(-1));
        sample.loss = number(s, "loss");
        sample.text = string_or(s, "text");
        if (const auto w = s.find("where"); w != s.end()) sample.origin = origin_of(*w);
        f.samples.push_back(std::move(sample));
      }
    }
    if (auto j = read_json_file(it->path() / "layers.json", run.notes, shown + "layers.json");
        j && j->is_object()) {
      for (const auto& [layer, norm] : j->items())
        if (norm.is_number()) f.layer_grad_norms.emplace_back(layer, norm.get<double>());
      std::sort(f.layer_grad_norms.begin(), f.layer_grad_norms.end(),
                [](const auto& a, const auto& b) { return a.second > b.second; });
    }
    run.forensics.push_back(std::move(f));
  }
  // By step, the first at a step before its -iter repeats, so they pair with pauses in order.
  std::sort(run.forensics.begin(), run.forensics.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.step, a.iteration.value_or(-1)) <
           std::make_pair(b.step, b.iteration.value_or(-1));
  });
}

// The incidents, from events.jsonl in file order; the forensics paired with their pauses.
void build_incidents(RunRecord& run) {
  std::map<int64_t, Incident> by_id;
  std::vector<bool> forensics_taken(run.forensics.size(), false);
  const Event* last_alarm = nullptr;  // the newest warn that carried an alarm
  auto incident = [&](int64_t id, const Event& e) -> Incident& {
    auto [it, fresh] = by_id.try_emplace(id);
    if (fresh) {
      it->second.id = id;
      it->second.first_step = e.step;
      it->second.first_iteration = e.iteration;
    }
    return it->second;
  };
  for (const Event& e : run.events) {
    const json& d = e.detail;
    if (e.kind == name_of(EventKind::kWarn) && d.contains("alarm")) last_alarm = &e;
    if (e.kind == name_of(EventKind::kPause)) {
      const auto id = integer(d, "incident");
      if (!id) continue;
      const bool fresh = by_id.find(*id) == by_id.end();
      Incident& inc = incident(*id, e);
      if (fresh) {
        inc.reason = string_or(d, "reason");
        inc.diagnosis = string_or(d, "diagnosis");
        inc.grad_norm = number(d, "grad_norm");
        inc.grad_norm_median = number(d, "grad_norm_median");
        inc.loss = number(d, "loss");
        inc.loss_median = number(d, "loss_median");
        if (last_alarm && last_alarm->step == e.step) {
          const auto it = last_alarm->detail.find("top_layers");
          if (it != last_alarm->detail.end() && it->is_array())
            for (const auto& l : *it)
              if (l.is_object() && number(l, "ratio"))
                inc.top_layers.emplace_back(string_or(l, "layer", "?"), *number(l, "ratio"));
        }
      }
      ++inc.alarms;
      if (const auto it = d.find("skipped"); it != d.end() && it->is_boolean() && it->get<bool>())
        ++inc.skipped_steps;
      // The trainer writes forensics at a pause (the first of an incident, and every rollback):
      // the next unclaimed directory of this step is this pause's.
      for (size_t i = 0; i < run.forensics.size(); ++i)
        if (!forensics_taken[i] && run.forensics[i].step == e.step) {
          forensics_taken[i] = true;
          inc.forensics.push_back(i);
          break;
        }
    } else if (e.kind == name_of(EventKind::kRollback)) {
      const auto id = integer(d, "incident");
      if (!id) continue;
      Incident& inc = incident(*id, e);
      Rollback r;
      r.from_step = integer(d, "from_step").value_or(e.step);
      r.to_step = integer(d, "to_step").value_or(e.step);
      r.checkpoint = string_or(d, "checkpoint");
      if (const auto q = d.find("quarantine"); q != d.end() && q->is_object())
        r.set_aside = integer(*q, "samples");
      inc.steps_redone += std::max<int64_t>(0, r.from_step - r.to_step);
      inc.rollbacks.push_back(std::move(r));
    } else if (e.kind == name_of(EventKind::kIncidentEnd)) {
      const auto id = integer(d, "id");
      if (!id) continue;
      Incident& inc = incident(*id, e);
      if (inc.reason.empty()) inc.reason = string_or(d, "reason");
      if (const auto first = integer(d, "first_step")) inc.first_step = *first;
      if (const auto first = integer(d, "first_iteration")) inc.first_iteration = *first;
      inc.end_step = e.step;
      inc.alarms = integer(d, "alarms").value_or(inc.alarms);
      inc.skipped_steps = integer(d, "skipped_steps").value_or(inc.skipped_steps);
    }
  }
  for (auto& [id, inc] : by_id) run.incidents.push_back(std::move(inc));
  size_t unpaired = 0;
  for (bool taken : forensics_taken) unpaired += taken ? 0 : 1;
  if (unpaired > 0)
    run.notes.push_back(fmt::format(
        "{} forensics director{} without a pause in events.jsonl: listed under the incidents",
        unpaired, unpaired == 1 ? "y" : "ies"));
}

void read_quarantine(const fs::path& path, RunRecord& run) {
  // A rollback's records carry no incident id; they are written at the rollback's iteration.
  std::map<int64_t, size_t> rollback_at;  // iteration → index into run.incidents
  std::map<int64_t, size_t> index_of;     // incident id → index
  for (size_t i = 0; i < run.incidents.size(); ++i) index_of[run.incidents[i].id] = i;
  for (const Event& e : run.events)
    if (e.kind == name_of(EventKind::kRollback) && e.iteration >= 0)
      if (const auto id = integer(e.detail, "incident"); id && index_of.count(*id))
        rollback_at[e.iteration] = index_of[*id];
  read_jsonl(
      path,
      [&](const json& j) {
        const std::string reason = string_or(j, "reason", "?");
        if (run.quarantine_first.size() < kQuarantineListed)
          run.quarantine_first.push_back({integer(j, "id").value_or(-1),
                                          integer(j, "step").value_or(-1), reason, origin_of(j)});
        ++run.quarantined;
        ++run.quarantined_by_reason[reason];
        std::optional<size_t> owner;
        if (const auto id = integer(j, "incident"); id && index_of.count(*id))
          owner = index_of[*id];
        else if (const auto it = rollback_at.find(integer(j, "iteration").value_or(-2));
                 reason == name_of(QuarantineReason::kRollback) && it != rollback_at.end())
          owner = it->second;
        if (owner) ++run.incidents[*owner].quarantined;
        return true;
      },
      run.notes);
}

void read_status(const fs::path& dir, RunRecord& run) {
  RunStatus& s = run.status;
  std::string last;  // the event of the last line: start, end, abnormal_end
  std::optional<int64_t> start_time;
  double wall = 0;
  bool any_wall = false;
  const bool found = read_jsonl(
      dir / "starts.jsonl",
      [&](const json& j) {
        const std::string event = string_or(j, "event");
        if (event.empty()) return false;
        last = event;
        if (event == "start") {
          ++s.starts;
          start_time = integer(j, "unix_time");
        } else if (event == "abnormal_end") {
          ++s.abnormal_ends;
          start_time.reset();
        } else if (event == "end") {
          if (const auto code = integer(j, "exit")) s.exit_code = static_cast<int>(*code);
          if (const auto t = integer(j, "unix_time"); t && start_time) {
            wall += static_cast<double>(*t - *start_time);
            any_wall = true;
          }
          start_time.reset();
        }
        return true;
      },
      run.notes);
  if (any_wall) s.wall_s = wall;

  const fs::path heartbeat = dir / "heartbeat";
  if (std::ifstream in(heartbeat); in) {
    int64_t step = 0;
    if (in >> step) s.heartbeat_step = step;
    // stat(2), not std::filesystem::last_write_time: libtorch.so exports its own copy of
    // libstdc++'s filesystem library (checkpoint/file_io.h), so which one links is not ours to say.
    struct stat st {};
    if (::stat(heartbeat.c_str(), &st) == 0)
      s.heartbeat_age_s = static_cast<double>(std::time(nullptr) - st.st_mtime);
  }
  auto from_exit = [](int code) -> std::string {
    if (code == 0) return "finished";
    if (code == 3) return "stopped";
    if (code == 130 || code == 143) return "interrupted";
    return "failed";
  };
  if (found && last == "end") {
    s.state = from_exit(s.exit_code.value_or(1));
  } else if (found && last == "start") {
    s.exit_code.reset();
    s.state =
        s.heartbeat_age_s && *s.heartbeat_age_s < kLiveHeartbeatS ? "running" : "no end recorded";
  } else {
    // No start log (an older keel, or a copied directory): the events say how it ended.
    s.state = "unknown";
    for (const Event& e : run.events) {
      if (e.kind == name_of(EventKind::kRunEnd)) s.state = "finished";
      if (e.kind == name_of(EventKind::kAbort)) s.state = "stopped";
      if (e.kind == name_of(EventKind::kInterrupted)) s.state = "interrupted";
    }
    if (!found) run.notes.push_back("no starts.jsonl: the run's status is read from its events");
  }
}

void flatten_yaml(const YAML::Node& node, const std::string& prefix,
                  std::vector<std::pair<std::string, std::string>>& out);

std::string inline_yaml(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsNull()) return "~";
  if (node.IsSequence()) {
    std::string s = "[";
    for (size_t i = 0; i < node.size(); ++i) s += (i ? ", " : "") + inline_yaml(node[i]);
    return s + "]";
  }
  if (node.IsMap()) {
    std::string s = "{";
    bool first = true;
    for (const auto& kv : node) {
      s += (first ? "" : ", ") + inline_yaml(kv.first) + ": " + inline_yaml(kv.second);
      first = false;
    }
    return s + "}";
  }
  return "";
}

void flatten_yaml(const YAML::Node& node, const std::string& prefix,
                  std::vector<std::pair<std::string, std::string>>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = inline_yaml(kv.first);  // a scalar, unless written by hand
      flatten_yaml(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else if (node.IsSequence() &&
             std::any_of(node.begin(), node.end(), [](const YAML::Node& n) { return n.IsMap(); })) {
    for (size_t i = 0; i < node.size(); ++i)
      out.emplace_back(fmt::format("{}[{}]", prefix, i), inline_yaml(node[i]));
  } else {
    out.emplace_back(prefix, inline_yaml(node));
  }
}

void read_config(const fs::path& path, RunRecord& run) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    run.notes.push_back(fmt::format(
        "no config.resolved.yaml: no config summary; the guard's bands are drawn at the default "
        "factors ({}x and {}x the running median)",
        run.warn_factor, run.pause_factor));
    return;
  }
  try {
    flatten_yaml(YAML::LoadFile(path.string()), "", run.config);
  } catch (const YAML::Exception& e) {
    run.notes.push_back(std::string("config.resolved.yaml: unreadable (") + e.what() + ")");
    return;
  }
  auto factor = [&](const char* key, double& into) {
    const std::string* v = run.config_value(key);
    if (!v) return;
    try {
      const double f = std::stod(*v);
      if (std::isfinite(f) && f > 0) into = f;
    } catch (const std::exception&) {
      run.notes.push_back(fmt::format("config.resolved.yaml: {}: not a number ({})", key, *v));
    }
  };
  factor("stability.warn_factor", run.warn_factor);
  factor("stability.pause_factor", run.pause_factor);
  if (const std::string* v = run.config_value("stability.enabled"))
    run.guard_enabled = *v != "false";
}

}  // namespace

const std::vector<double>* Metrics::column(const std::string& key) const {
  const auto it = columns.find(key);
  return it == columns.end() ? nullptr : &it->second;
}

const std::string* RunRecord::config_value(const std::string& key) const {
  for (const auto& [k, v] : config)
    if (k == key) return &v;
  return nullptr;
}

RunRecord load_run(const std::string& run_dir) {
  std::error_code ec;
  const fs::path dir(run_dir);
  if (!fs::is_directory(dir, ec))
    throw UserError(run_dir + ": no such directory" + relative_note(dir) +
                    "\nHINT: pass the run directory `keel train` "
                    "wrote (run.out_dir/run.name, or its --run-dir)");
  if (!fs::exists(dir / "metrics.jsonl", ec) && !fs::exists(dir / "events.jsonl", ec))
    throw UserError(run_dir +
                    ": not a run directory: it holds neither metrics.jsonl nor events.jsonl\n"
                    "HINT: pass the run directory `keel train` wrote (run.out_dir/run.name, or "
                    "its --run-dir)");
  RunRecord run;
  run.run_dir = fs::absolute(dir, ec).lexically_normal().string();
  if (ec) run.run_dir = run_dir;
  read_config(dir / "config.resolved.yaml", run);
  read_metrics(dir / "metrics.jsonl", run);
  read_events(dir / "events.jsonl", run);
  read_evals(dir / "eval.jsonl", run);
  read_forensics(dir / "forensics", run);
  build_incidents(run);
  read_quarantine(dir / "quarantine.jsonl", run);
  read_status(dir, run);
  return run;
}

}  // namespace keel::report
