// keel report: one self-contained HTML page of a run directory — the curves with every guard event
// on them, the incidents with their forensics, the data statistics and the config — written
// without LibTorch, so it runs anywhere the run directory can be read.
//
// It reads what the run wrote (docs/DESIGN.md, "Run directory"), and a run that is still going or
// one that crashed is as readable as a finished one: a truncated last line, a malformed line, a
// missing file are skipped and listed in the report's notes, never an error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::report {

// metrics.jsonl by column: every line's step, and every numeric field (nested objects of numbers
// flattened with '.', as sample_loss.p99; booleans as 0/1), NaN where a line lacks it. The
// per-layer and per-bucket maps are left out: the report does not plot them, and a long run of a
// deep model would hold millions of them.
struct Metrics {
  std::vector<int64_t> step;
  // A later line has a step at or before this one: a rollback or a resume went back past it, and
  // the update it logged belongs to an abandoned timeline.
  std::vector<bool> abandoned;
  std::map<std::string, std::vector<double>> columns;

  size_t size() const { return step.size(); }
  // The column `key`, or nullptr when no line has it.
  const std::vector<double>* column(const std::string& key) const;
};

struct Event {
  int64_t step = 0;
  int64_t iteration = -1;  // -1 when the line has none
  std::string kind;
  nlohmann::json detail = nlohmann::json::object();
};

struct EvalPoint {
  int64_t step = 0;
  double val_loss = 0;
  std::optional<double> floor;  // synthetic data: the chain's entropy rate
};

struct ForensicSample {
  int64_t id = -1;
  std::optional<double> loss;
  std::string text;    // decoded tokens, as written
  std::string origin;  // where it came from: "FILE:LINE id ID", else "SHARD @ OFFSET"; "" unknown
};

// A quarantine.jsonl record, as the page lists the first of them.
struct QuarantinedSample {
  int64_t id = -1, step = -1;
  std::string reason, origin;
};

// RUN_DIR/forensics/step_N[-iterI]/: what the trainer saved at a pause.
struct Forensics {
  std::string name;  // the directory's name
  int64_t step = -1;
  std::optional<int64_t> iteration;                              // the -iterI suffix
  std::vector<ForensicSample> samples;                           // samples.json, worst first
  std::vector<std::pair<std::string, double>> layer_grad_norms;  // layers.json, largest first
  std::vector<std::string> files;                                // what the directory holds
};

struct Rollback {
  int64_t from_step = 0, to_step = 0;
  std::string checkpoint;            // the stable snapshot it went back to
  std::optional<int64_t> set_aside;  // samples of the data window skipped with it
};

// One incident of the guard (events pause, rollback, incident_end carry its id).
struct Incident {
  int64_t id = 0;
  int64_t first_step = -1, first_iteration = -1;  // the first alarm (detection)
  std::string reason;                             // what alarmed: loss, grad_norm, nan...
  std::string diagnosis;  // the first pause's verdict: data (steps dropped) or model (rollback)
  std::optional<double> grad_norm, grad_norm_median, loss, loss_median;  // at detection
  std::vector<std::pair<std::string, double>> top_layers;  // layer, norm over its median
  int64_t alarms = 0;
  int64_t skipped_steps = 0;
  std::vector<Rollback> rollbacks;
  int64_t steps_redone = 0;         // updates thrown away by the rollbacks (and trained again)
  int64_t quarantined = 0;          // quarantine.jsonl records of the incident
  std::optional<int64_t> end_step;  // incident_end; none while it is open
  std::vector<size_t> forensics;    // indices into RunRecord::forensics
};

// Where the run is, from starts.jsonl and the heartbeat.
struct RunStatus {
  std::string
      state;  // finished | stopped | interrupted | failed | running | no end recorded | unknown
  std::optional<int> exit_code;
  std::optional<int64_t> heartbeat_step;
  std::optional<double> heartbeat_age_s;  // seconds since the heartbeat file last changed
  int starts = 0, abnormal_ends = 0;
  std::optional<double> wall_s;  // summed over the starts with an end
};

inline constexpr size_t kQuarantineListed = 20;

struct RunRecord {
  std::string run_dir;
  Metrics metrics;
  std::vector<Event> events;
  std::vector<EvalPoint> evals;
  std::vector<Forensics> forensics;
  std::vector<Incident> incidents;
  int64_t quarantined = 0;
  std::map<std::string, int64_t> quarantined_by_reason;
  std::vector<QuarantinedSample> quarantine_first;  // the first kQuarantineListed records
  RunStatus status;
  // config.resolved.yaml flattened: "stability.warn_factor" → "5.0", sequences as "[a, b]" and
  // each fault as "faults[0]" → "{kind: lr_spike, ...}"; in file order.
  std::vector<std::pair<std::string, std::string>> config;
  // The guard's bands (stability.warn_factor, pause_factor); the defaults when the config is gone.
  double warn_factor = 5, pause_factor = 10;
  bool guard_enabled = true;
  // What could not be read: missing files, malformed or truncated lines (counted per file).
  std::vector<std::string> notes;

  const std::string* config_value(const std::string& key) const;
};

// Reads RUN_DIR. Throws UserError (exit 2) when RUN_DIR is not a directory or holds neither
// metrics.jsonl nor events.jsonl; anything else unreadable becomes a note.
RunRecord load_run(const std::string& run_dir);

// The whole page: HTML with inline CSS and SVG, no script, nothing fetched.
std::string render_html(const RunRecord& run);

}  // namespace keel::report
