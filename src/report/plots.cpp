// The page's plots: inline SVG through svg::Plot, every full-width plot on the same x axis and
// left margin. Curves of the timeline the run kept are drawn in colour; what a rollback or a resume
// abandoned is drawn grey and dashed. Event markers of one kind that fall on the same few pixels
// are drawn as one, so a long run's thousands of events stay a few hundred shapes.
#include "report/plots.h"
#include "report/plot_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

namespace keel::report {
using namespace parts;

namespace {

using nlohmann::json;
using svg::Point;
using svg::Shape;

// The order is the event lanes' order, the guard's kinds first.
struct KindStyle {
  EventKind kind;
  EventStyle style;
};
const KindStyle kEventStyles[] = {
    {EventKind::kWarn,
     {Shape::kTriangleUp, "#e8a200",
      "a signal crossed its warn threshold (grad norm over warn_factor x its median, a screen, the "
      "clip rate); training goes on"}},
    {EventKind::kScreen,
     {Shape::kCircle, "#0c8599",
      "samples far above the per-sample loss baseline were masked out and quarantined"}},
    {EventKind::kPause,
     {Shape::kSquare, "#e03131",
      "an alarm: the guard paused, then dropped the step (data) or rolled back (model)"}},
    {EventKind::kSkipNan,
     {Shape::kCross, "#212529", "a non-finite loss or gradient: the update was skipped"}},
    {EventKind::kOverflow,
     {Shape::kCross, "#9c6644", "an fp16 overflow: the loss scaler skipped the update"}},
    {EventKind::kRollback,
     {Shape::kDiamond, "#7048e8",
      "rolled back to the newest stable snapshot (the arrow goes from the step to its target)"}},
    {EventKind::kScheduleBackoff,
     {Shape::kDiamond, "#f76707",
      "the model could not take its lr: rolled back and the schedule's peak lowered (lr plot)"}},
    {EventKind::kRecoveryStart,
     {Shape::kTriangleRight, "#2f9e44",
      "recovery began: lr x recovery.lr_factor for recovery.steps"}},
    {EventKind::kRecoveryEnd,
     {Shape::kTriangleLeft, "#2f9e44", "recovery ended: the schedule's lr again"}},
    {EventKind::kIncidentEnd,
     {Shape::kCircle, "#66a80f", "an incident closed after enough clean updates"}},
    {EventKind::kLoaderWait,
     {Shape::kTriangleUp, "#ae8a00", "the trainer waited for the data loader"}},
    {EventKind::kGradAccum,
     {Shape::kTick, "#495057",
      "dynamic accumulation changed the micro-batches per step (the lr follows the sqrt rule)"}},
    {EventKind::kAbort,
     {Shape::kCross, "#000000", "the run stopped itself (exit 3; 4 for a faulty device)"}},
    {EventKind::kHardwareFault,
     {Shape::kCross, "#d6336c",
      "a device computed wrong (replicas disagreed, or the step computed again did not bring "
      "the alarm back): the step was skipped or redone, its data not blamed"}},
    {EventKind::kCrashLoop,
     {Shape::kCross, "#c92a2a", "two abnormal ends at the same step: a crash loop"}},
    {EventKind::kInterrupted,
     {Shape::kCross, "#868e96", "SIGINT/SIGTERM: checkpointed and exited"}},
    {EventKind::kResume, {Shape::kTriangleRight, "#1c7ed6", "resumed from a checkpoint"}},
    {EventKind::kStableSnapshot, {Shape::kTick, "#1c7ed6", "a checkpoint promoted to stable"}},
    {EventKind::kCheckpoint, {Shape::kTick, "#adb5bd", "a checkpoint was saved"}},
    {EventKind::kCheckpointCadence,
     {Shape::kTick, "#ced4da", "the checkpoint cadence was measured"}},
    {EventKind::kMemory,
     {Shape::kTick, "#ced4da", "the memory plan and the measured peak were recorded"}},
    {EventKind::kRunStart, {Shape::kTriangleRight, "#868e96", "the process started"}},
    {EventKind::kRunEnd, {Shape::kTriangleLeft, "#868e96", "the run ended"}},
};
const EventStyle kUnknownStyle{Shape::kCircle, "#adb5bd",
                               "an event this keel report does not know"};

using svg::escape;
using svg::format_number;

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string value_text(const std::string& key, const json& v) {
  if (v.is_number_float()) return format_number(v.get<double>());
  if (v.is_number()) return v.dump();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    return key == "path" || key == "checkpoint" ? basename_of(s) : s;
  }
  if (v.is_array() && key == "top_layers") {
    std::string out;
    for (size_t i = 0; i < v.size() && i < 3; ++i)
      if (v[i].is_object())
        out += fmt::format("{}{} x{}", i ? ", " : "", text_or(v[i], "layer", "?"),
                           format_number(number_or(v[i], "ratio", kNaN)));
    return out;
  }
  if (v.is_array() && key == "top_samples") {
    if (v.empty() || !v[0].is_object()) return fmt::format("{} samples", v.size());
    return fmt::format("{} samples, worst id {} (loss {})", v.size(),
                       format_number(number_or(v[0], "id", -1)),
                       format_number(number_or(v[0], "loss", kNaN)));
  }
  if (v.is_object()) {
    std::string out;
    for (const auto& [k, x] : v.items())
      if (!x.is_structured()) out += (out.empty() ? "" : ", ") + k + " " + value_text(k, x);
    return "{" + out + "}";
  }
  if (v.is_array()) return fmt::format("[{} items]", v.size());
  return v.dump();
}

std::string where(const Event& e) {
  return e.iteration >= 0 ? fmt::format("step {} (iteration {})", e.step, e.iteration)
                          : fmt::format("step {}", e.step);
}

// One line: an event among many in a grouped marker's tooltip.
std::string describe_short(const Event& e) {
  std::string out = where(e) + ":";
  int n = 0;
  for (const auto& [k, v] : e.detail.items()) {
    if (k == "message" || k == "top_samples" || n++ >= 6) continue;
    out += " " + k + " " + value_text(k, v) + ";";
  }
  if (out.back() == ';') out.pop_back();
  return out;
}

// Events of one kind that fall on the same few pixels become one marker: a run with thousands of
// screens draws a few hundred shapes, and the tooltip counts them.
struct EventGroup {
  std::vector<const Event*> events;
  double x = 0;
  double value = kNaN;  // the largest value among them (the marker's height on a curve)
};

std::string group_title(const EventGroup& g) {
  if (g.events.size() == 1) return describe(*g.events.front());
  const Event& first = *g.events.front();
  int64_t lo = first.step, hi = first.step;
  for (const Event* e : g.events) lo = std::min(lo, e->step), hi = std::max(hi, e->step);
  std::string out = fmt::format("{} x {} at steps {}", g.events.size(), first.kind,
                                lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi));
  size_t shown = 0;
  for (const Event* e : g.events) {
    if (shown++ == 6) {
      out += fmt::format("\n  ... and {} more", g.events.size() - 6);
      break;
    }
    out += "\n  " + describe_short(*e);
  }
  return out;
}

// x of an event: a rollback (or a schedule back-off) is drawn where it happened (from_step), not
// at the step it went to.
double event_x(const Event& e) {
  const double step = static_cast<double>(e.step);
  return e.kind == name_of(EventKind::kRollback) || e.kind == name_of(EventKind::kScheduleBackoff)
             ? number_or(e.detail, "from_step", step)
             : step;
}

std::vector<EventGroup> group_events(const std::vector<const Event*>& events, double x_lo,
                                     double x_hi,
                                     const std::function<double(const Event&)>& value) {
  // 3 px buckets of the full-width plot.
  const double per_bucket = (x_hi - x_lo) / ((kWidth - kLeft) / 3.0);
  std::map<int64_t, EventGroup> groups;
  for (const Event* e : events) {
    const double x = event_x(*e);
    const int64_t b =
        per_bucket > 0 ? static_cast<int64_t>(std::floor((x - x_lo) / per_bucket)) : 0;
    EventGroup& g = groups[b];
    if (g.events.empty()) g.x = x;
    g.events.push_back(e);
    const double v = value ? value(*e) : kNaN;
    if (std::isfinite(v) && !(v <= g.value)) g.value = v;
  }
  std::vector<EventGroup> out;
  for (auto& [b, g] : groups) out.push_back(std::move(g));
  return out;
}

}  // namespace

namespace parts {

Timeline timeline_of(const Metrics& m, const std::string& key) {
  Timeline t;
  const auto* column = m.column(key);
  if (!column) return t;
  std::vector<Point>* piece = nullptr;
  for (size_t i = 0; i < m.size(); ++i) {
    const Point p{static_cast<double>(m.step[i]), (*column)[i]};
    if (!m.abandoned[i]) {
      piece = nullptr;
      if (std::isfinite(p.y)) t.kept.push_back(p);
      continue;
    }
    if (!piece) {
      piece = &t.abandoned.emplace_back();
      if (i > 0 && m.step[i - 1] < m.step[i] && std::isfinite((*column)[i - 1]))
        piece->push_back({static_cast<double>(m.step[i - 1]), (*column)[i - 1]});
    }
    if (std::isfinite(p.y)) piece->push_back(p);
  }
  return t;
}

svg::Axis x_axis(const PlotContext& c) {
  svg::Axis a;
  a.lo = c.x_lo;
  a.hi = c.x_hi;
  a.label = "step";
  return a;
}

void draw_timeline(svg::Plot& plot, const Timeline& t, const std::string& color,
                   const std::string& name) {
  for (const auto& piece : t.abandoned)
    plot.line(svg::downsample_min_max(piece, kBuckets), kAbandonedColor, 1.4, "4 3", 0.9,
              name + ", abandoned by a rollback or a resume");
  std::string title = name;
  if (!t.kept.empty())
    title += fmt::format(" ({} logged steps; last {} at step {})", t.kept.size(),
                         format_number(t.kept.back().y), static_cast<int64_t>(t.kept.back().x));
  plot.line(svg::downsample_min_max(t.kept, kBuckets), color, 1.6, "", 1.0, title);
}

// Faint vertical rules where the guard paused or rolled back, on every plot.
void draw_incident_rules(svg::Plot& plot, const PlotContext& c) {
  for (const auto& g :
       group_events(c.of_kind({EventKind::kPause, EventKind::kRollback}), c.x_lo, c.x_hi, nullptr))
    plot.x_rule(g.x, style_of(g.events.front()->kind).color, 0.35, group_title(g));
}

// Markers of `kinds` at the value each event's detail holds (its loss, its grad norm), clamped to
// the frame; an event without that value sits at the top edge.
void draw_event_marks(svg::Plot& plot, const PlotContext& c, std::initializer_list<EventKind> kinds,
                      const std::function<double(const Event&)>& value) {
  for (const EventKind kind : kinds) {
    const EventStyle& s = style_of(kind);
    for (const auto& g : group_events(c.of_kind({kind}), c.x_lo, c.x_hi, value))
      plot.mark(s.shape, s.color, g.x, g.value, kMarkSize, group_title(g));
  }
}

// Hover columns: per stretch of steps, the values logged there.
void draw_hover(svg::Plot& plot, const PlotContext& c,
                const std::vector<std::pair<std::string, std::string>>& keys) {
  const Metrics& m = c.run.metrics;
  std::vector<std::vector<size_t>> columns(kHoverColumns);
  const double span = c.x_hi - c.x_lo;
  for (size_t i = 0; i < m.size(); ++i) {
    if (m.abandoned[i]) continue;
    const int col = span > 0 ? static_cast<int>((m.step[i] - c.x_lo) / span * kHoverColumns) : 0;
    columns[std::clamp(col, 0, kHoverColumns - 1)].push_back(i);
  }
  for (int col = 0; col < kHoverColumns; ++col) {
    const auto& rows = columns[col];
    if (rows.empty()) continue;
    const int64_t s0 = m.step[rows.front()], s1 = m.step[rows.back()];
    std::string title = s0 == s1 ? fmt::format("step {}", s0) : fmt::format("steps {}-{}", s0, s1);
    for (const auto& [key, label] : keys) {
      const auto* column = m.column(key);
      if (!column) continue;
      Range r;
      for (size_t i : rows) r.add((*column)[i]);
      if (r.empty()) continue;
      title +=
          "\n" + label + " " +
          (r.lo == r.hi ? format_number(r.lo) : format_number(r.lo) + " to " + format_number(r.hi));
    }
    plot.hover_column(c.x_lo + span * col / kHoverColumns,
                      c.x_lo + span * (col + 1) / kHoverColumns, title);
  }
}

std::string legend(const std::vector<std::string>& items) {
  std::string out = "<div class=\"legend\">";
  for (const auto& i : items) out += "<span>" + i + "</span>";
  return out + "</div>\n";
}

std::string figure(const std::string& title, const std::string& caption,
                   const std::string& legend_html, const std::string& svg_text) {
  std::string out = "<figure>\n<h3>" + escape(title) + "</h3>\n";
  if (!caption.empty()) out += "<p class=\"caption\">" + caption + "</p>\n";
  return out + legend_html + svg_text + "</figure>\n";
}

std::string marker_legend(EventKind kind, const std::string& text) {
  const EventStyle& s = style_of(kind);
  return svg::legend_marker(s.shape, s.color) + escape(text);
}

// The legend entries of the event kinds a plot marks, for those on record.
void add_marker_legends(std::vector<std::string>& items, const PlotContext& c,
                        std::initializer_list<MarkerLegend> kinds) {
  for (const auto& [kind, note] : kinds)
    if (!c.of_kind({kind}).empty())
      items.push_back(marker_legend(
          kind, note ? fmt::format("{} ({})", name_of(kind), note) : std::string(name_of(kind))));
}

}  // namespace parts

double number_or(const json& j, const char* key, double fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string text_or(const json& j, const char* key, const std::string& fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

const EventStyle& style_of(EventKind kind) {
  for (const auto& s : kEventStyles)
    if (s.kind == kind) return s.style;
  return kUnknownStyle;
}

const EventStyle& style_of(const std::string& kind) {
  for (const auto& s : kEventStyles)
    if (kind == name_of(s.kind)) return s.style;
  return kUnknownStyle;
}

std::string describe(const Event& e) {
  std::string out = e.kind + " at " + where(e);
  for (const auto& [k, v] : e.detail.items()) out += "\n  " + k + ": " + value_text(k, v);
  return out;
}

PlotContext::PlotContext(const RunRecord& r) : run(r) {
  for (const auto& e : run.events) events.push_back(&e);
  // Every step on record, from 0: the first logged step is 1, the first eval 0.
  Range x;
  for (int64_t s : run.metrics.step) x.add(static_cast<double>(s));
  for (const auto& e : run.evals) x.add(static_cast<double>(e.step));
  for (const Event* e : events) x.add(event_x(*e)), x.add(static_cast<double>(e->step));
  x_lo = x.empty() ? 0 : std::min(x.lo, 0.0);
  x_hi = !x.empty() && x.hi > x_lo ? x.hi : x_lo + 1;
}

std::vector<const Event*> PlotContext::of_kind(std::initializer_list<EventKind> kinds) const {
  std::vector<const Event*> out;
  for (const Event* e : events)
    for (const EventKind k : kinds)
      if (e->kind == name_of(k)) out.push_back(e);
  return out;
}

std::vector<std::string> PlotContext::kinds() const {
  std::set<std::string> on_record;
  for (const Event* e : events) on_record.insert(e->kind);
  std::vector<std::string> kinds;
  for (const auto& s : kEventStyles)
    if (on_record.erase(name_of(s.kind))) kinds.push_back(name_of(s.kind));
  // The others in the order they first appear: erased once listed.
  for (const Event* e : events)
    if (on_record.erase(e->kind)) kinds.push_back(e->kind);
  return kinds;
}

std::string events_plot(const PlotContext& c) {
  const std::vector<std::string> kinds = c.kinds();
  if (kinds.empty()) return "<p class=\"caption\">No events on record.</p>\n";
  const int lanes = static_cast<int>(kinds.size());
  svg::Axis y;
  y.ticks = false;
  svg::Plot plot("plot-events", kWidth, 10 + 34 + 19.0 * lanes, x_axis(c), y, kLeft);
  std::string legend_html = "<div class=\"legend\">";
  for (int lane = 0; lane < lanes; ++lane) {
    const std::string& kind = kinds[lane];
    const EventStyle& s = style_of(kind);
    std::vector<const Event*> of_kind;
    for (const Event* e : c.events)
      if (e->kind == kind) of_kind.push_back(e);
    plot.lane_label(lane, lanes, kind);
    if (kind == name_of(EventKind::kRollback))
      for (const Event* e : of_kind)
        plot.lane_arrow(lane, lanes, event_x(*e), static_cast<double>(e->step), s.color,
                        describe(*e));
    for (const auto& g : group_events(of_kind, c.x_lo, c.x_hi, nullptr))
      plot.lane_mark(lane, lanes, s.shape, s.color, g.x, group_title(g));
    legend_html += fmt::format("<span title=\"{}\">{}{} <b>{}</b></span>", escape(s.meaning),
                               svg::legend_marker(s.shape, s.color), escape(kind), of_kind.size());
  }
  legend_html += "</div>\n";
  return figure("Events",
                "Every event of events.jsonl, one lane per kind, at its step (a rollback at the "
                "step it left, its arrow pointing at the snapshot it went back to). Hover a marker "
                "for its details; markers that fall together count their events.",
                legend_html, plot.render());
}

std::string loss_plot(const PlotContext& c) {
  const RunRecord& run = c.run;
  const Timeline loss = timeline_of(run.metrics, "loss");
  std::vector<Point> val;
  std::optional<double> floor;
  for (const auto& e : run.evals) {
    val.push_back({static_cast<double>(e.step), e.val_loss});
    if (e.floor) floor = e.floor;
  }
  // A step whose samples were all masked reports a loss of 0: no loss to mark.
  const auto event_loss = [](const Event& e) {
    for (const char* key : {"loss", "max_loss"})
      if (const auto it = e.detail.find(key);
          it != e.detail.end() && it->is_number() && it->get<double>() > 0)
        return it->get<double>();
    return kNaN;
  };
  Range r;
  r.add(loss.kept);
  r.add(val);
  if (floor) r.add(*floor);
  // The abandoned timeline and the alarms' losses, when they are not far off the kept curves'
  // scale; a diverged stretch would flatten everything else, so it runs off the frame instead.
  const double cap = r.empty() ? std::numeric_limits<double>::infinity() : r.hi + 2 * (r.hi - r.lo);
  for (const auto& piece : loss.abandoned)
    for (const auto& p : piece)
      if (p.y <= cap) r.add(p.y);
  for (const Event* e :
       c.of_kind({EventKind::kWarn, EventKind::kPause, EventKind::kSkipNan, EventKind::kScreen}))
    if (event_loss(*e) <= cap) r.add(event_loss(*e));
  svg::Plot plot("plot-loss", kWidth, 300, x_axis(c), r.axis(false, "loss"), kLeft);
  draw_incident_rules(plot, c);
  draw_timeline(plot, loss, kTrainColor, "train loss");
  if (floor)
    plot.y_rule(*floor, kFloorColor, "floor " + format_number(*floor),
                fmt::format("loss floor {} (eval.jsonl: the synthetic chain's entropy rate; no "
                            "model can go below it)",
                            format_number(*floor)));
  if (!val.empty()) {
    plot.line(val, kValColor, 2, "", 1.0, "val loss");
    for (const auto& e : run.evals) {
      std::string title = fmt::format("step {}: val loss {}", e.step, format_number(e.val_loss));
      if (e.floor)
        title += fmt::format(" (floor {}, {} above it)", format_number(*e.floor),
                             format_number(e.val_loss - *e.floor));
      plot.mark(Shape::kCircle, kValColor, static_cast<double>(e.step), e.val_loss, 7, title);
    }
  }
  draw_hover(plot, c, {{"loss", "loss"}, {"sample_loss.max", "worst sample"}});
  draw_event_marks(plot, c,
                   {EventKind::kScreen, EventKind::kWarn, EventKind::kSkipNan, EventKind::kPause},
                   event_loss);
  std::vector<std::string> items = {svg::legend_line(kTrainColor, 2, "") + "train loss"};
  if (!loss.abandoned.empty())
    items.push_back(svg::legend_line(kAbandonedColor, 2, "4 3") + "abandoned timeline");
  if (!val.empty()) items.push_back(svg::legend_line(kValColor, 2, "") + "val loss");
  if (floor) items.push_back(svg::legend_line(kFloorColor, 2, "6 4") + "loss floor");
  add_marker_legends(items, c,
                     {{EventKind::kWarn},
                      {EventKind::kScreen, "worst sample"},
                      {EventKind::kPause},
                      {EventKind::kSkipNan}});
  std::string caption =
      "Train loss as logged (metrics.jsonl), val loss (eval.jsonl). Markers sit at the loss the "
      "event measured, which a logged step may not show; vertical rules mark pauses and rollbacks.";
  if (loss.kept.empty() && loss.abandoned.empty()) caption += " <b>No loss logged yet.</b>";
  return figure("Loss", caption, legend(items), plot.render());
}

std::string grad_norm_plot(const PlotContext& c) {
  const RunRecord& run = c.run;
  const Timeline norm = timeline_of(run.metrics, "grad_norm");
  const Timeline median = timeline_of(run.metrics, "grad_norm_median");
  const Timeline clip = timeline_of(run.metrics, "clip_bound");
  const auto event_norm = [](const Event& e) {
    const auto it = e.detail.find("grad_norm");
    return it != e.detail.end() && it->is_number() ? it->get<double>() : kNaN;
  };
  Range r;
  r.add(norm.kept, true);
  for (const auto& p : norm.abandoned) r.add(p, true);
  r.add(median.kept, true);
  for (const Event* e : c.of_kind({EventKind::kWarn, EventKind::kPause}))
    r.add(event_norm(*e), true);
  const std::vector<Point> m = svg::downsample_min_max(median.kept, kBuckets);
  if (run.guard_enabled)
    for (const auto& p : m) r.add(p.y * run.pause_factor * 1.5, true);
  svg::Plot plot("plot-grad-norm", kWidth, 300, x_axis(c), r.axis(true, "grad norm"), kLeft);
  std::vector<std::string> items = {svg::legend_line(kTrainColor, 2, "") + "grad norm",
                                    svg::legend_line(kMedianColor, 2, "") + "running median"};
  if (run.guard_enabled && !m.empty()) {
    std::vector<Point> warn = m, pause = m, top = m;
    for (auto& p : warn) p.y *= run.warn_factor;
    for (auto& p : pause) p.y *= run.pause_factor;
    for (auto& p : top) p.y *= run.pause_factor * 1e6;
    const std::string w = format_number(run.warn_factor), z = format_number(run.pause_factor);
    plot.band(
        warn, pause, kWarnBand, 0.16,
        fmt::format("warn band: grad norm over {}x its running median (stability.warn_factor)", w));
    plot.band(pause, top, kPauseBand, 0.12,
              fmt::format("pause band: grad norm over {}x its running median "
                          "(stability.pause_factor): an alarm",
                          z));
    items.push_back(svg::legend_swatch(kWarnBand, 0.35) + "warn band (" + w + "x median)");
    items.push_back(svg::legend_swatch(kPauseBand, 0.3) + "pause band (" + z + "x median)");
  }
  draw_incident_rules(plot, c);
  if (!clip.kept.empty()) {
    plot.line(svg::downsample_min_max(clip.kept, kBuckets), "#adb5bd", 1.2, "2 3", 1.0,
              "clip bound (optim.grad_clip, or the adaptive bound)");
    items.push_back(svg::legend_line("#adb5bd", 1.5, "2 3") + "clip bound");
  }
  // The median over the norm: a noisy norm would hide it.
  draw_timeline(plot, norm, kTrainColor, "grad norm");
  draw_timeline(plot, median, kMedianColor, "running median of the grad norm");
  draw_hover(plot, c,
             {{"grad_norm", "grad norm"},
              {"grad_norm_median", "median"},
              {"clip_rate", "clip rate"},
              {"clip_bound", "clip bound"}});
  draw_event_marks(plot, c,
                   {EventKind::kWarn, EventKind::kSkipNan, EventKind::kOverflow, EventKind::kPause},
                   event_norm);
  add_marker_legends(items, c,
                     {{EventKind::kWarn},
                      {EventKind::kPause},
                      {EventKind::kSkipNan, "at the top: no finite norm"},
                      {EventKind::kOverflow}});
  std::string caption =
      "Global gradient L2 norm (log scale) against the guard's running median. A norm in the "
      "amber band warns; in the red band it alarms. Markers sit at the norm the event measured.";
  if (!run.guard_enabled) caption += " <b>The guard is off (stability.enabled: false).</b>";
  return figure("Gradient norm", caption, legend(items), plot.render());
}

}  // namespace keel::report
