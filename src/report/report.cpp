// render_html: a RunRecord as one page — a header with the run's state, the plots (plots.cpp),
// the incidents with their forensics, the events, the config and the notes on what could not be
// read. Inline CSS; no script, no font, nothing fetched.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "common/event_kind.h"
#include "report/plots.h"
#include "report/report.h"
#include "report/svg.h"

namespace keel::report {

namespace {

using nlohmann::json;
using svg::escape;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using svg::format_number;

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string opt_number(const std::optional<double>& v) { return v ? format_number(*v) : "-"; }

// One pause's forensics under its incident: the files, per-layer norms and top samples.
std::string forensics_rows(const Forensics& f) {
  std::string out;
  out += "<tr class=\"forensics\"><td></td><td colspan=\"10\">";
  out += fmt::format("<div class=\"muted\">forensics/<span class=\"mono\">{}</span>: {}</div>",
                     escape(f.name), escape([&] {
                       std::string files;
                       for (const auto& n : f.files) files += (files.empty() ? "" : ", ") + n;
                       return files.empty() ? std::string("(empty)") : files;
                     }()));
  if (!f.layer_grad_norms.empty()) {
    std::string norms;
    for (const auto& [layer, v] : f.layer_grad_norms)
      norms += fmt::format("{}<span class=\"mono\">{}</span> {}", norms.empty() ? "" : ", ",
                           escape(layer), format_number(v));
    out += "<div class=\"muted\">per-layer grad norms: " + norms + "</div>";
  }
  out += "</td></tr>\n";
  out += "<tr class=\"forensics\"><td></td><td colspan=\"10\">";
  if (f.samples.empty()) {
    out += "<span class=\"muted\">no samples.json</span>";
  } else {
    out +=
        "<table class=\"samples\"><tr><th>#</th><th>sample</th><th>loss</th><th>from</th>"
        "<th>text (the decoded tokens)</th></tr>\n";
    for (size_t i = 0; i < f.samples.size(); ++i) {
      const ForensicSample& s = f.samples[i];
      if (i == 3)  // the top three shown, the rest behind <details>
        out += fmt::format(
            "</table><details><summary>{} more samples</summary><table class=\"samples\">\n",
            f.samples.size() - 3);
      out += fmt::format(
          "<tr class=\"sample\"><td class=\"num\">{}</td><td class=\"num mono\">{}</td>"
          "<td class=\"num\">{}</td><td class=\"mono\">{}</td>"
          "<td class=\"sample-text\" title=\"{}\">{}</td></tr>\n",
          i + 1, s.id, opt_number(s.loss), escape(s.origin.empty() ? "-" : s.origin),
          escape(svg::truncate_utf8(s.text, 4000)), escape(svg::truncate_utf8(s.text, 360)));
    }
    out += f.samples.size() > 3 ? "</table></details>" : "</table>";
  }
  out += "</td></tr>\n";
  return out;
}

std::string incident_rows(const RunRecord& run, const Incident& inc) {
  std::string alarm = escape(inc.reason.empty() ? "-" : inc.reason);
  if (inc.grad_norm && inc.grad_norm_median && *inc.grad_norm_median > 0)
    alarm += fmt::format("<br><span class=\"muted\">grad norm {} = {}x median</span>",
                         format_number(*inc.grad_norm),
                         format_number(*inc.grad_norm / *inc.grad_norm_median));
  if (inc.loss && inc.loss_median && *inc.loss_median > 0)
    alarm += fmt::format("<br><span class=\"muted\">loss {} = {}x median</span>",
                         format_number(*inc.loss), format_number(*inc.loss / *inc.loss_median));
  std::string verdict = "-";
  if (inc.diagnosis == "data")
    verdict = "data<br><span class=\"muted\">the model was fine: the step was dropped</span>";
  else if (inc.diagnosis == "model")
    verdict = "model<br><span class=\"muted\">worse than the stable snapshot: rolled back</span>";
  else if (!inc.diagnosis.empty())
    verdict = escape(inc.diagnosis);
  std::string layers;
  for (size_t i = 0; i < inc.top_layers.size() && i < 3; ++i)
    layers += fmt::format("{}<span class=\"mono\">{}</span> x{}", i ? "<br>" : "",
                          escape(inc.top_layers[i].first), format_number(inc.top_layers[i].second));
  if (layers.empty() && !inc.forensics.empty()) {  // no alarm named them: the largest norms
    const auto& norms = run.forensics[inc.forensics.front()].layer_grad_norms;
    for (size_t i = 0; i < norms.size() && i < 3 && norms[i].second > 0; ++i)
      layers += fmt::format("{}<span class=\"mono\">{}</span> {}", i ? "<br>" : "",
                            escape(norms[i].first), format_number(norms[i].second));
  }
  std::string rollbacks;
  for (const auto& r : inc.rollbacks) {
    rollbacks +=
        fmt::format("{}step {} &rarr; {}", rollbacks.empty() ? "" : "<br>", r.from_step, r.to_step);
    if (!r.checkpoint.empty())
      rollbacks += " <span class=\"mono muted\">" + escape(basename_of(r.checkpoint)) + "</span>";
    if (r.set_aside)
      rollbacks += fmt::format(" <span class=\"muted\">({} samples skipped)</span>", *r.set_aside);
  }
  std::string out = fmt::format(
      "<tr class=\"incident\" id=\"incident-{}\"><td class=\"num\">{}</td><td>step {}{}</td>"
      "<td>{}</td><td>{}</td><td class=\"layers\">{}</td><td>{}</td><td class=\"num\">{}</td>"
      "<td class=\"num\">{}</td><td class=\"num\">{}</td><td "
      "class=\"num\">{}</td><td>{}</td></tr>\n",
      inc.id, inc.id, inc.first_step,
      inc.first_iteration >= 0
          ? fmt::format("<br><span class=\"muted\">iteration {}</span>", inc.first_iteration)
          : "",
      alarm, verdict, layers.empty() ? "-" : layers, rollbacks.empty() ? "-" : rollbacks,
      inc.steps_redone, inc.skipped_steps, inc.alarms, inc.quarantined,
      inc.end_step ? fmt::format("step {}", *inc.end_step) : "<b>open</b>");
  for (size_t index : inc.forensics) out += forensics_rows(run.forensics[index]);
  return out;
}

std::string incidents_section(const PlotContext& c) {
  const RunRecord& run = c.run;
  std::string out = "<section id=\"incidents\">\n<h2>Incidents</h2>\n";
  int64_t rollbacks = 0, redone = 0;
  for (const auto& i : run.incidents) {
    rollbacks += static_cast<int64_t>(i.rollbacks.size());
    redone += i.steps_redone;
  }
  if (run.incidents.empty()) {
    out += "<p>No incident: the guard never paused.</p>\n";
  } else {
    out += fmt::format(
        "<p class=\"caption\">{} incident{}, {} rollback{}, {} steps redone. Detection: the first "
        "alarm. Top layers: gradient norm over each layer's running median at that alarm. The "
        "samples are the forensics' top samples by loss (the pause's batch).</p>\n",
        run.incidents.size(), run.incidents.size() == 1 ? "" : "s", rollbacks,
        rollbacks == 1 ? "" : "s", redone);
    out +=
        "<table class=\"incidents\"><thead><tr><th>#</th><th>detected</th><th>alarm</th>"
        "<th>verdict</th><th>top layers</th><th>rollback (to the stable snapshot)</th>"
        "<th>steps redone</th><th>steps dropped</th><th>alarms</th><th>quarantined</th>"
        "<th>ended</th></tr></thead>\n<tbody>\n";
    for (const auto& inc : run.incidents) out += incident_rows(run, inc);
    out += "</tbody></table>\n";
  }
  // Forensics no pause on record claimed (events.jsonl cut short, or a copied directory).
  std::set<size_t> claimed;
  for (const auto& inc : run.incidents) claimed.insert(inc.forensics.begin(), inc.forensics.end());
  if (claimed.size() < run.forensics.size()) {
    out += "<h3>Forensics without a pause on record</h3>\n<table class=\"incidents\"><tbody>\n";
    for (size_t i = 0; i < run.forensics.size(); ++i)
      if (!claimed.count(i)) {
        Incident one;
        one.forensics = {i};
        std::string rows = incident_rows(run, one);
        out += rows.substr(rows.find("</tr>\n") + 6);  // its forensics rows only
      }
    out += "</tbody></table>\n";
  }
  // Quarantine and screens.
  int64_t screens = 0, masked = 0;
  for (const Event* e : c.of_kind({EventKind::kScreen})) {
    ++screens;
    masked += static_cast<int64_t>(number_or(e->detail, "masked", 0));
  }
  out += "<h3>Quarantine</h3>\n<p>";
  if (run.quarantined == 0) {
    out += "No sample set aside (quarantine.jsonl is empty or absent).";
  } else {
    out += fmt::format("{} samples set aside in quarantine.jsonl:", run.quarantined);
    for (const auto& [reason, n] : run.quarantined_by_reason)
      out += fmt::format(" <span class=\"pill\">{} {}</span>", escape(reason), n);
  }
  if (screens > 0)
    out += fmt::format("<br>The screen masked {} samples in {} steps (events <i>{}</i>).", masked,
                       screens, name_of(EventKind::kScreen));
  out += "</p>\n";
  if (!run.quarantine_first.empty()) {
    out += fmt::format(
        "<table class=\"samples\"><tr><th>step</th><th>sample</th><th>reason</th><th>from (input "
        "record, else shard and offset)</th></tr>\n");
    for (const auto& q : run.quarantine_first)
      out += fmt::format(
          "<tr><td class=\"num\">{}</td><td class=\"num mono\">{}</td><td>{}</td>"
          "<td class=\"mono\">{}</td></tr>\n",
          q.step, q.id, escape(q.reason), escape(q.origin.empty() ? "-" : q.origin));
    out += "</table>\n";
    if (run.quarantined > static_cast<int64_t>(run.quarantine_first.size()))
      out +=
          fmt::format("<p class=\"muted\">The first {} of {}; quarantine.jsonl has them all.</p>\n",
                      run.quarantine_first.size(), run.quarantined);
  }
  out += "</section>\n";
  return out;
}

// Faults a device made (replicas that disagreed, steps whose alarm did not come back when computed
// again): which rank and host, what was found, what became of the step.
std::string machine_faults_section(const PlotContext& c) {
  std::string out = "<section id=\"machine\">\n<h2>Machine faults</h2>\n";
  const auto faults = c.of_kind({EventKind::kHardwareFault});
  if (faults.empty())
    return out +
           "<p>None on record: no device computed a result that its replicas or a replay of the "
           "step contradicted.</p>\n</section>\n";
  out += fmt::format(
      "<p class=\"caption\">{} fault{}. An alarm's step is computed again before its data is "
      "blamed (one rank on, under several ranks); a part that does not come back is the "
      "device's. A rank's second fault within the window, or a device wrong every time, stops "
      "the run (exit 4) and lists its host in exclude_hosts.</p>\n",
      faults.size(), faults.size() == 1 ? "" : "s");
  out +=
      "<table class=\"incidents\"><thead><tr><th>step</th><th>rank (host)</th><th>found</th>"
      "<th>the step</th><th>replay</th></tr></thead>\n<tbody>\n";
  for (const Event* e : faults) {
    const json& d = e->detail;
    std::string ranks;
    const json hosts = d.value("hosts", json::array());
    for (const auto& r : d.value("ranks", json::array())) {
      const auto rank = r.get<int64_t>();
      ranks += fmt::format("{}{}", ranks.empty() ? "" : "<br>", rank);
      if (rank >= 0 && rank < static_cast<int64_t>(hosts.size()) && hosts[rank].is_string())
        ranks +=
            " <span class=\"mono muted\">(" + escape(hosts[rank].get<std::string>()) + ")</span>";
    }
    const std::string cause = d.value("cause", "");
    const std::string found = cause == "persistent"       ? "wrong every time"
                              : cause == "not_reproduced" ? "did not come back when replayed"
                                                          : "replicas disagreed";
    const std::string step = cause == "persistent"       ? "saved, then the run stopped"
                             : cause == "not_reproduced" ? "redone from the replay"
                                                         : "skipped on every rank";
    out += fmt::format(
        "<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>"
        "</tr>\n",
        e->step, ranks.empty() ? "none named" : ranks, found, step,
        d.contains("seconds") ? fmt::format("{:.3f} s", number_or(d, "seconds", 0)) : "-");
  }
  return out + "</tbody></table>\n</section>\n";
}

std::string events_table(const PlotContext& c) {
  struct Count {
    int64_t n = 0, first = 0, last = 0;
  };
  std::map<std::string, Count> by_kind;
  for (const Event* e : c.events) {
    auto [it, fresh] = by_kind.try_emplace(e->kind, Count{0, e->step, e->step});
    ++it->second.n;
    it->second.first = std::min(it->second.first, e->step);
    it->second.last = std::max(it->second.last, e->step);
  }
  std::string out =
      "<table class=\"events\"><thead><tr><th>event</th><th>count</th><th>steps</th>"
      "<th>meaning</th></tr></thead><tbody>\n";
  for (const auto& kind : c.kinds()) {
    const Count& v = by_kind[kind];
    const EventStyle& s = style_of(kind);
    out += fmt::format(
        "<tr><td>{}<span class=\"mono\">{}</span></td><td class=\"num\">{}</td><td>{}</td>"
        "<td class=\"muted\">{}</td></tr>\n",
        svg::legend_marker(s.shape, s.color), escape(kind), v.n,
        v.first == v.last ? std::to_string(v.first) : fmt::format("{} - {}", v.first, v.last),
        escape(s.meaning));
  }
  return out + "</tbody></table>\n";
}

std::string config_section(const RunRecord& run, const std::optional<json>& start) {
  struct Group {
    const char* title;
    std::vector<const char*> prefixes;
  };
  const std::vector<Group> groups = {
      {"Model", {"model."}},
      {"Data", {"data."}},
      {"Optimizer and schedule",
       {"optim.", "schedule.", "run.max_steps", "run.precision", "run.device", "run.seed"}},
      {"Stability", {"stability."}},
      {"Checkpoints and eval", {"checkpoint.", "eval."}},
      {"Faults injected", {"faults["}},
  };
  std::string out = "<section id=\"config\">\n<h2>Config</h2>\n";
  if (run.config.empty())
    return out + "<p>No config.resolved.yaml in the run directory.</p>\n</section>\n";
  out +=
      "<p class=\"caption\">From config.resolved.yaml: the config the run used, overrides "
      "applied.";
  if (start && start->contains("parameters"))
    out +=
        fmt::format(" Parameters: <b>{}</b>.", format_number(number_or(*start, "parameters", 0)));
  if (const std::string* mb = run.config_value("data.micro_batch_size"))
    if (const std::string* accum = run.config_value("data.grad_accum_steps"))
      if (const std::string* seq = run.config_value("model.seq_len")) try {
          const auto world = static_cast<int64_t>(start ? number_or(*start, "world_size", 1) : 1);
          const int64_t batch = std::stoll(*mb) * std::stoll(*accum) * world;
          out += fmt::format(" Global batch: <b>{}</b> samples = <b>{}</b> tokens per step.", batch,
                             format_number(static_cast<double>(batch * std::stoll(*seq))));
        } catch (const std::exception&) {
        }
  out += "</p>\n<div class=\"config-grid\">\n";
  for (const auto& g : groups) {
    std::string rows;
    for (const auto& [key, value] : run.config)
      for (const char* prefix : g.prefixes)
        if (key.rfind(prefix, 0) == 0) {
          // The section's name is the group's title; with several sections, keys stay whole.
          const std::string shown = g.prefixes.size() == 1 && std::string(prefix).back() == '.'
                                        ? key.substr(std::string(prefix).size())
                                        : key;
          rows += fmt::format("<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>\n",
                              escape(shown), escape(value));
          break;
        }
    if (rows.empty()) continue;
    out += fmt::format("<div{}><h3>{}</h3><table class=\"kv\">\n{}</table></div>\n",
                       g.prefixes.front() == std::string("faults[") ? " class=\"wide\"" : "",
                       g.title, rows);
  }
  return out + "</div>\n</section>\n";
}

std::string duration(double s) {
  if (s >= 3600)
    return fmt::format("{}h {:02d}m", static_cast<int64_t>(s / 3600),
                       static_cast<int64_t>(s / 60) % 60);
  if (s >= 60)
    return fmt::format("{}m {:02d}s", static_cast<int64_t>(s / 60), static_cast<int64_t>(s) % 60);
  return fmt::format("{:.1f} s", s);
}

std::string card(const std::string& key, const std::string& value, const std::string& sub = "") {
  return "<div class=\"card\"><div class=\"k\">" + escape(key) + "</div><div class=\"v\">" + value +
         "</div>" + (sub.empty() ? "" : "<div class=\"s\">" + sub + "</div>") + "</div>\n";
}

// The title line: the run's name and its state as a badge.
std::string title_line(const RunRecord& run) {
  const std::string* name = run.config_value("run.name");
  std::string title = name ? *name : std::filesystem::path(run.run_dir).filename().string();
  if (title.empty()) title = run.run_dir;
  const RunStatus& st = run.status;
  std::string badge_class = "unknown";
  if (st.state == "finished") badge_class = "ok";
  if (st.state == "running") badge_class = "live";
  if (st.state == "stopped" || st.state == "failed" || st.state == "no end recorded")
    badge_class = "bad";
  std::string badge = st.state;
  if (st.exit_code) badge += fmt::format(" (exit {})", *st.exit_code);
  if (st.state == "running" && st.heartbeat_age_s)
    badge += fmt::format(", heartbeat {:.0f} s ago", *st.heartbeat_age_s);

  return "<header>\n<h1>" + escape(title) + " <span class=\"status " + badge_class + "\">" +
         escape(badge) + "</span></h1>\n";
}

std::string header(const PlotContext& c, const std::optional<json>& start, const Event* end) {
  const RunRecord& run = c.run;
  const Metrics& m = run.metrics;
  const RunStatus& st = run.status;
  std::string out = title_line(run);
  out += "<div class=\"path mono\">" + escape(run.run_dir) + "</div>\n<div class=\"cards\">\n";

  // Step: the newest kept step logged (or where the heartbeat says the run is).
  std::optional<int64_t> step;
  for (size_t i = 0; i < m.size(); ++i)
    if (!m.abandoned[i]) step = std::max(step.value_or(m.step[i]), m.step[i]);
  if (end) step = std::max(step.value_or(end->step), end->step);
  if (!step && st.heartbeat_step) step = st.heartbeat_step;
  const std::string* max_steps = run.config_value("run.max_steps");
  out += card("step", step ? std::to_string(*step) : "-",
              max_steps ? "of run.max_steps " + escape(*max_steps) : "");

  auto last_kept = [&](const char* key) -> std::optional<std::pair<int64_t, double>> {
    const auto* column = m.column(key);
    if (!column) return std::nullopt;
    for (size_t i = m.size(); i-- > 0;)
      if (!m.abandoned[i] && std::isfinite((*column)[i]))
        return std::make_pair(m.step[i], (*column)[i]);
    return std::nullopt;
  };
  if (const auto loss = last_kept("loss"))
    out += card("train loss", format_number(loss->second), fmt::format("at step {}", loss->first));
  if (!run.evals.empty()) {
    const EvalPoint& e = run.evals.back();
    std::string sub = fmt::format("at step {}", e.step);
    if (e.floor)
      sub += fmt::format("; floor {}, {:+.1f} %", format_number(*e.floor),
                         (e.val_loss / *e.floor - 1) * 100);
    out += card("val loss", format_number(e.val_loss), sub);
  }
  if (const auto tokens = last_kept("tokens_seen"))
    out += card("tokens seen", format_number(tokens->second),
                last_kept("tokens_per_s")
                    ? format_number(last_kept("tokens_per_s")->second) + " tokens/s at the end"
                    : "");
  int64_t rollbacks = 0, redone = 0;
  for (const auto& i : run.incidents) {
    rollbacks += static_cast<int64_t>(i.rollbacks.size());
    redone += i.steps_redone;
  }
  out += card(
      "incidents", std::to_string(run.incidents.size()),
      fmt::format("{} rollback{}, {} steps redone", rollbacks, rollbacks == 1 ? "" : "s", redone));
  out += card("quarantined", std::to_string(run.quarantined), "samples set aside");
  std::map<std::string, int64_t> counts;
  for (const Event* e : c.events) ++counts[e->kind];
  std::string others;
  for (const EventKind k :
       {EventKind::kWarn, EventKind::kScreen, EventKind::kSkipNan, EventKind::kOverflow})
    if (const char* kind = name_of(k); counts[kind] > 0)
      others += fmt::format("{}{} {}", others.empty() ? "" : ", ", counts[kind], kind);
  out += card("pauses", std::to_string(counts[name_of(EventKind::kPause)]), others);
  std::optional<double> wall;
  if (end && std::isfinite(number_or(end->detail, "seconds", kNaN)))
    wall = number_or(end->detail, "seconds", kNaN);
  if (!wall) wall = st.wall_s;
  std::string starts = fmt::format("{} start{}", st.starts, st.starts == 1 ? "" : "s");
  if (st.abnormal_ends > 0) starts += fmt::format(", {} abnormal end(s)", st.abnormal_ends);
  if (wall || st.starts > 0)
    out += card("wall time", wall ? duration(*wall) : "-", st.starts > 0 ? starts : "");
  if (start) {
    const std::string* arch = run.config_value("model.arch");
    const auto world = static_cast<int64_t>(number_or(*start, "world_size", 1));
    out += card("parameters", format_number(number_or(*start, "parameters", 0)),
                fmt::format("{}{}, {} rank{}", arch ? escape(*arch) + " on " : "",
                            escape(text_or(*start, "device", "?")), world, world == 1 ? "" : "s"));
  }
  out += "</div>\n";
  if (!run.notes.empty())
    out += fmt::format(
        "<p class=\"warning\">{} note{} on what could not be read: <a href=\"#notes\">below</a>."
        "</p>\n",
        run.notes.size(), run.notes.size() == 1 ? "" : "s");
  return out + "</header>\n";
}

const char* const kCss = R"css(
:root{--fg:#1f2328;--muted:#656d76;--border:#d0d7de;--bg:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
  color:var(--fg);background:var(--bg)}
main{max-width:1200px;margin:0 auto;padding:18px 24px 40px}
h1{font-size:23px;margin:0 0 2px}
h2{font-size:17px;margin:0 0 8px}
h3{font-size:14px;margin:6px 0 2px}
.path{color:var(--muted);font-size:12px;word-break:break-all}
.status{display:inline-block;padding:2px 10px;border-radius:999px;font-size:13px;font-weight:600;
  vertical-align:middle;margin-left:6px}
.status.ok{background:#dafbe1;color:#116329}.status.live{background:#ddf4ff;color:#0969da}
.status.bad{background:#ffebe9;color:#cf222e}.status.unknown{background:#eaeef2;color:#57606a}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(165px,1fr));gap:10px;
  margin:12px 0 4px}
.card{background:#fff;border:1px solid var(--border);border-radius:8px;padding:7px 12px}
.card .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.03em}
.card .v{font-size:19px;font-weight:600;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.card .s{font-size:12px;color:var(--muted)}
section{background:#fff;border:1px solid var(--border);border-radius:8px;padding:14px 18px;
  margin:14px 0}
figure{margin:0 0 14px}
.caption{font-size:12.5px;color:var(--muted);margin:0 0 4px}
.legend{display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12.5px;color:#424a53;margin:2px 0 2px}
.legend span{display:inline-flex;align-items:center;gap:5px}
svg.key{flex:none}
svg.plot{display:block;width:100%;height:auto}
svg.plot text{font-size:11px;font-family:system-ui,sans-serif;fill:#57606a}
svg.plot text.lane-label{fill:#1f2328;font-size:11.5px}
svg.plot text.axis-label{fill:#424a53;font-size:11.5px}
svg.plot text.rule-label{font-size:11.5px;font-weight:600}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:4px 24px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #eaeef2;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600;font-size:12.5px}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.layers{white-space:nowrap}
tr.incident td{border-top:2px solid #d0d7de;background:#fffdf6}
tr.forensics td{border-bottom:none;padding-top:2px}
table.samples{margin:2px 0 6px}
table.samples td,table.samples th{padding:3px 6px;border-bottom:1px solid #f0f2f4}
td.sample-text{font:12px/1.35 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
  white-space:pre-wrap;word-break:break-all;color:#24292f}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.muted{color:var(--muted)}
.pill{display:inline-block;background:#eaeef2;border-radius:999px;padding:0 8px;margin:0 2px;
  font-size:12.5px}
.config-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:6px 24px}
.config-grid .wide{grid-column:1/-1}
.config-grid .wide td:first-child{width:10%}
table.kv td{padding:2px 8px}
table.kv td:first-child{color:var(--muted);width:48%}
details summary{cursor:pointer;color:#0969da;font-size:12.5px;margin:2px 0}
.warning{background:#fff8c5;border:1px solid #eac54f;border-radius:6px;padding:6px 10px;
  font-size:13px}
ul.notes{margin:4px 0;padding-left:20px}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:10px}
)css";

}  // namespace

std::string render_html(const RunRecord& run) {
  const PlotContext c(run);

  std::optional<json> start;  // the newest start's detail: device, parameters, world size
  const Event* end = nullptr;
  for (const Event* e : c.events) {
    if (e->kind == name_of(EventKind::kRunStart)) start = e->detail;
    if (e->kind == name_of(EventKind::kRunEnd)) end = e;
  }
  const std::string* name = run.config_value("run.name");
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>keel report: " + escape(name ? *name : run.run_dir) + "</title>\n";
  out += "<style>" + std::string(kCss) + "</style>\n</head>\n<body>\n<main>\n";
  out += header(c, start, end);
  out += "<section id=\"curves\">\n<h2>Training curves</h2>\n";
  out += events_plot(c);
  out += loss_plot(c);
  out += grad_norm_plot(c);
  out += lr_plot(c);
  out += "</section>\n";
  out += incidents_section(c);
  out += machine_faults_section(c);
  out += "<section id=\"data\">\n<h2>Data</h2>\n" + data_plots(c) + "</section>\n";
  out += "<section id=\"events\">\n<h2>Events</h2>\n" + events_table(c) + "</section>\n";
  out += config_section(run, start);
  out += "<section id=\"notes\">\n<h2>Notes</h2>\n";
  if (run.notes.empty()) {
    out += "<p>Every file of the run directory was read in full.</p>\n";
  } else {
    out += "<ul class=\"notes\">\n";
    for (const auto& n : run.notes) out += "<li class=\"note\">" + escape(n) + "</li>\n";
    out += "</ul>\n";
  }
  out += "</section>\n";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", &utc);
  out += fmt::format("<footer>written by keel report{} on {}</footer>\n",
#ifdef KEEL_VERSION
                     " " KEEL_VERSION,
#else
                     "",
#endif
                     stamp);
  out += "</main>\n</body>\n</html>\n";
  return out;
}

}  // namespace keel::report
