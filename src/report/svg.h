// Inline SVG plots for `keel report`: a plot is an <svg> element written as text, with its axes,
// tick labels and <title> tooltips, and nothing that needs a script, a font or the network.
// Coordinates: x is the training step, y the value; Plot maps them to pixels of a viewBox that the
// page scales to its width.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace keel::report::svg {

struct Point {
  double x = 0, y = 0;
};

// At most 2 * buckets points of `points` (sorted by x): for every bucket of equal x width the
// lowest and the highest point, in their order, so a one-step spike survives any zoom-out.
// Non-finite values are dropped. Fewer points than 2 * buckets come back unchanged.
std::vector<Point> downsample_min_max(const std::vector<Point>& points, size_t buckets);

// "Nice" tick positions (1, 2, 5 × 10^k) covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target);
// Decades within [lo, hi] (lo > 0); with 2 and 5 added when fewer than three decades are in view.
std::vector<double> log_ticks(double lo, double hi);
// A compact label: 1.5k, 2.4M, 3e-4, 0.25, 1.849.
std::string format_number(double v);

// Text for HTML and SVG: & < > " ' escaped, invalid UTF-8 and control characters (but tab and
// newline) replaced by U+FFFD, so whatever a run directory holds cannot break the page.
std::string escape(std::string_view text);
// `text` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD: a file
// from a byte-level tokenizer or a hand edit then parses as JSON and shows as text.
std::string repair_utf8(std::string_view text);
// At most `max_bytes` bytes of `text`, cut at a UTF-8 character boundary, "…" appended when cut.
std::string truncate_utf8(std::string_view text, size_t max_bytes);

// Markers: one shape per event kind (report.cpp holds the table), drawn the same in the plots
// and the legend.
enum class Shape {
  kCircle,
  kTriangleUp,
  kSquare,
  kDiamond,
  kCross,
  kTriangleRight,
  kTriangleLeft,
  kTick
};
// One marker centred on (cx, cy) pixels; `title` (plain text) becomes its tooltip.
std::string marker(Shape shape, const std::string& color, double cx, double cy, double size,
                   const std::string& title);
// A small stand-alone <svg> of one marker, or of a line style, for an HTML legend.
std::string legend_marker(Shape shape, const std::string& color);
std::string legend_line(const std::string& color, double width, const std::string& dash,
                        double opacity = 1.0);
std::string legend_swatch(const std::string& color, double opacity);

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::string label;
  bool ticks = true;  // grid lines and tick labels (a swimlane's y has none)
};

// One plot: a frame with grid lines and tick labels, content clipped to the frame, markers
// clamped into it (an off-scale spike stays visible at the edge; its tooltip has the value).
// Build it with the data ranges known, add content in data coordinates, then render().
class Plot {
 public:
  // `left_margin` holds the y tick labels (or a swimlane's row names): plots stacked with the same
  // width and margin share their x positions, so a step lines up across them.
  Plot(std::string id, double width, double height, Axis x, Axis y, double left_margin = 64);

  // A polyline through `points`; an empty `dash` is solid.
  void line(const std::vector<Point>& points, const std::string& color, double width,
            const std::string& dash, double opacity, const std::string& title);
  // Vertical stems from the x axis (y = 0, or the bottom of a log axis) up to each point.
  void stems(const std::vector<Point>& points, const std::string& color, double width,
             const std::string& title);
  // The area between `lower` and `upper` (same x values, sorted), filled.
  void band(const std::vector<Point>& lower, const std::vector<Point>& upper,
            const std::string& color, double opacity, const std::string& title);
  // A shaded span of steps [x0, x1] over the full height.
  void x_span(double x0, double x1, const std::string& color, double opacity,
              const std::string& title);
  void x_rule(double x, const std::string& color, double opacity, const std::string& title);
  // A horizontal dashed rule with a label at its right end.
  void y_rule(double y, const std::string& color, const std::string& label,
              const std::string& title);
  // A marker at (x, y) in data coordinates, clamped into the frame.
  void mark(Shape shape, const std::string& color, double x, double y, double size,
            const std::string& title);
  // Transparent columns over [x0, x1] with a tooltip each: the reader hovers anywhere on a curve
  // and reads the values logged in that stretch of steps.
  void hover_column(double x0, double x1, const std::string& title);
  // A lane of the frame's height divided in `lanes` rows, for a swimlane chart: a marker in row
  // `lane` (0 at the top) at step x, and the row's name left of the frame.
  void lane_label(int lane, int lanes, const std::string& text);
  void lane_mark(int lane, int lanes, Shape shape, const std::string& color, double x,
                 const std::string& title);
  // An arrow inside row `lane` from step x_from to step x_to (a rollback going back in steps).
  void lane_arrow(int lane, int lanes, double x_from, double x_to, const std::string& color,
                  const std::string& title);

  double px(double x) const;  // data → pixels
  double py(double y) const;
  std::string render() const;

 private:
  double lane_y(int lane, int lanes) const;

  std::string id_;
  double width_, height_;
  Axis x_, y_;
  double left_ = 64, right_ = 16, top_ = 10, bottom_ = 34;
  std::string underlay_;  // spans and bands, under the grid's labels and the curves
  std::string content_;   // curves, clipped to the frame
  std::string overlay_;   // markers and labels, not clipped
  std::string hover_;     // the tooltip columns, on top so they receive the pointer
};

}  // namespace keel::report::svg
