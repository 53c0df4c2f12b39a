// Internal to src/report: the parts every plot of the page is drawn with (plots.cpp), shared by
// the plot functions in plots.cpp and data_plots.cpp, and the page's sizes and colours.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "report/plots.h"
#include "report/svg.h"

namespace keel::report::parts {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kWidth = 1100;  // the full-width plots' viewBox
inline constexpr double kLeft = 136;    // their shared left margin: the event lanes' names fit
inline constexpr double kSmallWidth = 540;
inline constexpr size_t kBuckets = 1000;  // at most 2000 points per curve
inline constexpr int kHoverColumns = 160;
inline constexpr double kMarkSize = 9;

inline constexpr const char* kTrainColor = "#1f6feb";
inline constexpr const char* kAbandonedColor = "#8c959f";
inline constexpr const char* kValColor = "#e8590c";
inline constexpr const char* kFloorColor = "#2b9348";
inline constexpr const char* kMedianColor = "#343a40";
inline constexpr const char* kWarnBand = "#f5a300";
inline constexpr const char* kPauseBand = "#e03131";
inline constexpr const char* kRecoveryColor = "#2f9e44";
inline constexpr const char* kPalette[] = {"#1f6feb", "#e8590c", "#7048e8", "#0ca678", "#c2255c"};

// A metric along the kept timeline, and the abandoned stretches, each starting from the point it
// branched off (the row logged before it).
struct Timeline {
  std::vector<svg::Point> kept;
  std::vector<std::vector<svg::Point>> abandoned;
};
Timeline timeline_of(const Metrics& m, const std::string& key);

// The values a plot's y axis must show.
struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v, bool log = false) {
    if (!std::isfinite(v) || (log && !(v > 0))) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  void add(const std::vector<svg::Point>& points, bool log = false) {
    for (const auto& p : points) add(p.y, log);
  }
  bool empty() const { return !(lo <= hi); }
  // Padded for drawing: 6 % of the span each side, or a factor on a log axis.
  svg::Axis axis(bool log, const std::string& label = "") const {
    svg::Axis a;
    a.log = log;
    a.label = label;
    if (empty()) return a;
    if (log) {
      a.lo = lo / 1.4;
      a.hi = hi * 1.4;
    } else {
      // A constant series (a queue depth of 0 all along) gets a visible span around it.
      const double pad = hi > lo ? (hi - lo) * 0.06 : (hi == 0 ? 1 : std::abs(hi) * 0.1);
      a.lo = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
      a.hi = hi + pad;
    }
    return a;
  }
};

svg::Axis x_axis(const PlotContext& c);  // the steps, shared by every full-width plot
void draw_timeline(svg::Plot& plot, const Timeline& t, const std::string& color,
                   const std::string& name);
void draw_incident_rules(svg::Plot& plot, const PlotContext& c);  // pauses and rollbacks
void draw_event_marks(svg::Plot& plot, const PlotContext& c, std::initializer_list<EventKind> kinds,
                      const std::function<double(const Event&)>& value);
void draw_hover(svg::Plot& plot, const PlotContext& c,
                const std::vector<std::pair<std::string, std::string>>& keys);
std::string legend(const std::vector<std::string>& items);
std::string figure(const std::string& title, const std::string& caption,
                   const std::string& legend_html, const std::string& svg_text);
std::string marker_legend(EventKind kind, const std::string& text);
// A legend entry for an event kind a plot marks: the kind's name, then `note` in brackets.
struct MarkerLegend {
  EventKind kind;
  const char* note = nullptr;
};
// The entries of the kinds on record; a kind the run never wrote gets none.
void add_marker_legends(std::vector<std::string>& items, const PlotContext& c,
                        std::initializer_list<MarkerLegend> kinds);

}  // namespace keel::report::parts
