// The page's lr plot (the schedule times the recovery overlay) and its data plots (tokens,
// throughput, the loader, the screen, per-sample losses, step time, clip rate, update ratio).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/event_kind.h"
#include "report/plot_parts.h"

namespace keel::report {
using namespace parts;
using svg::escape;
using svg::Point;

std::string lr_plot(const PlotContext& c) {
  const RunRecord& run = c.run;
  const Timeline lr = timeline_of(run.metrics, "lr");
  Range r;
  r.add(lr.kept);
  // An abandoned lr far above the kept one (an lr spike the guard rolled back) runs off the frame.
  const double cap = r.empty() ? std::numeric_limits<double>::infinity() : r.hi * 1.5;
  for (const auto& piece : lr.abandoned)
    for (const auto& p : piece)
      if (p.y <= cap) r.add(p.y);
  if (!r.empty()) r.lo = std::min(r.lo, 0.0);
  svg::Plot plot("plot-lr", kWidth, 220, x_axis(c), r.axis(false, "learning rate"), kLeft);
  // Recovery windows: from each recovery_start to its recovery_end (or to its until_step, or the
  // last step while it is still on).
  struct Window {
    double from, to;
    const Event* start;
  };
  std::vector<Window> windows;
  std::optional<Window> open;
  for (const Event* e : c.events) {
    if (e->kind == name_of(EventKind::kRecoveryStart)) {
      if (open) windows.push_back({open->from, std::max(open->from, open->to), open->start});
      const double until = number_or(e->detail, "until_step", c.x_hi);
      open = Window{static_cast<double>(e->step), until, e};
    } else if (e->kind == name_of(EventKind::kRecoveryEnd) && open) {
      windows.push_back({open->from, static_cast<double>(e->step), open->start});
      open.reset();
    }
  }
  if (open) windows.push_back({open->from, std::min(open->to, c.x_hi), open->start});
  for (const auto& w : windows)
    plot.x_span(w.from, w.to, kRecoveryColor, 0.14,
                fmt::format("recovery from step {} to {}: {}", static_cast<int64_t>(w.from),
                            static_cast<int64_t>(w.to), describe(*w.start)));
  draw_incident_rules(plot, c);
  draw_timeline(plot, lr, "#7048e8", "learning rate");
  draw_hover(plot, c, {{"lr", "lr"}, {"recovery", "recovering (1 = yes)"}});
  const auto lr_at = [&](const Event& e) {  // the kept lr logged nearest the event's step
    double best = kNaN, distance = std::numeric_limits<double>::infinity();
    for (const auto& p : lr.kept)
      if (std::abs(p.x - e.step) < distance) distance = std::abs(p.x - e.step), best = p.y;
    return best;
  };
  draw_event_marks(
      plot, c, {EventKind::kRecoveryStart, EventKind::kRecoveryEnd, EventKind::kScheduleBackoff},
      lr_at);
  std::vector<std::string> items = {svg::legend_line("#7048e8", 2, "") + "learning rate"};
  if (!windows.empty())
    items.push_back(svg::legend_swatch(kRecoveryColor, 0.3) + "recovery window");
  add_marker_legends(items, c, {{EventKind::kRecoveryStart}, {EventKind::kRecoveryEnd}});
  return figure("Learning rate",
                "The schedule's lr times the recovery overlay; shaded: the recovery windows after "
                "a rollback (lr x stability.recovery.lr_factor).",
                legend(items), plot.render());
}

struct SmallPlot {
  const char* id;
  const char* title;
  std::vector<std::pair<const char*, const char*>> series;  // key, legend label
  bool log = false;
  bool stems = false;
};

std::string data_plots(const PlotContext& c) {
  const std::vector<SmallPlot> specs = {
      {"plot-data-tokens", "Tokens seen", {{"tokens_seen", "tokens"}}},
      {"plot-data-throughput", "Throughput (tokens/s)", {{"tokens_per_s", "tokens/s"}}},
      {"plot-data-loader-wait", "Loader wait per step (ms)", {{"loader_wait_ms", "wait"}}},
      {"plot-data-queue", "Loader queue depth (batches ready)", {{"queue_depth", "batches"}}},
      {"plot-data-masked",
       "Samples masked by the screen, per logging window",
       {{"masked_samples", "masked samples"}},
       false,
       true},
      {"plot-data-skipped",
       "Steps skipped (dropped or non-finite), per logging window",
       {{"skipped_steps", "skipped steps"}},
       false,
       true},
      {"plot-data-sample-loss",
       "Per-sample loss of the logged step",
       {{"sample_loss.p50", "p50"}, {"sample_loss.p99", "p99"}, {"sample_loss.max", "max"}}},
      {"plot-data-doc-len",
       "Document length (tokens)",
       {{"doc_len.mean", "mean"}, {"doc_len.p95", "p95"}}},
      {"plot-data-step-time", "Step time (ms)", {{"step_ms", "step"}, {"guard_ms", "guard"}}},
      {"plot-data-comm", "All-reduce per step (ms)", {{"comm_ms", "all-reduce"}}},
      {"plot-data-stragglers",
       "Ranks' own work per step (ms): the median rank and the slowest one's lag behind it",
       {{"median_rank_work_ms", "median rank"}, {"rank_lag_ms", "slowest rank's lag"}}},
      {"plot-data-clip-rate", "Clip rate (share of steps clipped)", {{"clip_rate", "clip rate"}}},
      {"plot-data-update-ratio", "Update / weight ratio", {{"update_ratio", "ratio"}}, true},
      {"plot-data-loss-scale", "fp16 loss scale", {{"loss_scale", "scale"}}, true},
  };
  std::string out;
  int drawn = 0;
  for (const auto& spec : specs) {
    std::vector<Timeline> lines;
    Range r;
    for (const auto& [key, label] : spec.series) {
      lines.push_back(timeline_of(c.run.metrics, key));
      r.add(lines.back().kept, spec.log);
    }
    if (r.empty()) continue;
    if (!spec.log) r.lo = std::min(r.lo, 0.0);
    svg::Plot plot(spec.id, kSmallWidth, 190, x_axis(c), r.axis(spec.log), 56);
    draw_incident_rules(plot, c);
    std::vector<std::string> items;
    std::vector<std::pair<std::string, std::string>> hover;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string color = kPalette[i % std::size(kPalette)];
      const std::string label = spec.series[i].second;
      if (lines[i].kept.empty()) continue;
      const auto points = svg::downsample_min_max(lines[i].kept, kBuckets);
      if (spec.stems)
        plot.stems(points, color, 3, label);
      else
        plot.line(points, color, 1.5, "", 1.0, label);
      items.push_back((spec.stems ? svg::legend_swatch(color, 1) : svg::legend_line(color, 2, "")) +
                      escape(label));
      hover.emplace_back(spec.series[i].first, label);
    }
    draw_hover(plot, c, hover);
    out += "<div>" + figure(spec.title, "", legend(items), plot.render()) + "</div>\n";
    ++drawn;
  }
  if (drawn == 0) return "<p class=\"caption\">metrics.jsonl has no data statistics yet.</p>\n";
  return "<p class=\"caption\">From metrics.jsonl, along the kept timeline (each value is the "
         "logging window's: an average, or a count since the previous logged step).</p>\n"
         "<div class=\"grid2\">\n" +
         out + "</div>\n";
}

}  // namespace keel::report
