// The page's plots (plots.cpp), and what the rest of the page (report.cpp) shares with them: the
// event kinds' markers and meanings, and an event's description. Internal to src/report/.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "common/event_kind.h"
#include "report/report.h"
#include "report/svg.h"

namespace keel::report {

// An event kind's marker, and what it means (the legend's tooltip). Every kind of the contract
// (common/event_kind.h) has its own; a kind this keel does not know, from another version's run
// directory, gets a grey circle.
struct EventStyle {
  svg::Shape shape;
  const char* color;
  const char* meaning;
};
const EventStyle& style_of(EventKind kind);
const EventStyle& style_of(const std::string& kind);  // a name as events.jsonl carries it

// A field of an event's detail (or any object), or `fallback` when it is absent or of another
// type: a run directory of another keel version, or edited by hand, never makes the report throw.
double number_or(const nlohmann::json& j, const char* key, double fallback);
std::string text_or(const nlohmann::json& j, const char* key, const std::string& fallback);

// Every detail field of the event on its own line: a marker's tooltip.
std::string describe(const Event& e);

// What the plots of one page share: the run, and the steps every plot spans, so that a step lines
// up from the event lanes down to the data statistics.
struct PlotContext {
  explicit PlotContext(const RunRecord& r);

  const RunRecord& run;
  double x_lo = 0, x_hi = 1;
  std::vector<const Event*> events;  // run.events, in file order

  std::vector<const Event*> of_kind(std::initializer_list<EventKind> kinds) const;
  // The kinds on record: the contract's in a fixed order (the guard's first), then any others.
  std::vector<std::string> kinds() const;
};

// Each returns a <figure> (or a group of them) with its heading, caption, legend and <svg>; the
// <svg> ids (plot-events, plot-loss, plot-grad-norm, plot-lr, plot-data-*) are for tests.
std::string events_plot(const PlotContext& c);
std::string loss_plot(const PlotContext& c);
std::string grad_norm_plot(const PlotContext& c);
std::string lr_plot(const PlotContext& c);
std::string data_plots(const PlotContext& c);

}  // namespace keel::report
