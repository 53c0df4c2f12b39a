#include "report/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace keel::report::svg {

namespace {

// One decimal is a tenth of a pixel: finer coordinates only make the file bigger.
std::string num(double v) { return fmt::format("{:.1f}", v); }

std::string titled(const std::string& title) {
  return title.empty() ? "" : "<title>" + escape(title) + "</title>";
}

std::string with_title(const std::string& open_tag, const std::string& element,
                       const std::string& title) {
  // open_tag without its closing '>': <circle ... → <circle ...><title/></circle>
  if (title.empty()) return open_tag + "/>";
  return open_tag + ">" + titled(title) + "</" + element + ">";
}

}  // namespace

std::vector<Point> downsample_min_max(const std::vector<Point>& points, size_t buckets) {
  std::vector<Point> finite;
  finite.reserve(points.size());
  for (const auto& p : points)
    if (std::isfinite(p.x) && std::isfinite(p.y)) finite.push_back(p);
  if (buckets == 0 || finite.size() <= 2 * buckets) return finite;
  const double x0 = finite.front().x, x1 = finite.back().x;
  const double width = (x1 - x0) / static_cast<double>(buckets);
  std::vector<Point> out;
  out.reserve(2 * buckets + 2);
  size_t i = 0;
  while (i < finite.size()) {
    // [i, j): the points of this bucket.
    const size_t bucket =
        width > 0 ? std::min(buckets - 1, static_cast<size_t>((finite[i].x - x0) / width)) : 0;
    size_t j = i, lo = i, hi = i;
    while (j < finite.size() &&
           (width > 0 ? std::min(buckets - 1, static_cast<size_t>((finite[j].x - x0) / width))
                      : 0) == bucket) {
      if (finite[j].y < finite[lo].y) lo = j;
      if (finite[j].y > finite[hi].y) hi = j;
      ++j;
    }
    out.push_back(finite[std::min(lo, hi)]);
    if (lo != hi) out.push_back(finite[std::max(lo, hi)]);
    i = j;
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  std::vector<double> ticks;
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int i = 0; i < 1000; ++i) {
    double v = first + i * step;
    if (v > hi + step * 1e-9) break;
    if (std::abs(v) < step * 1e-9) v = 0;  // not 1.3e-17
    ticks.push_back(v);
  }
  return ticks;
}

std::vector<double> log_ticks(double lo, double hi) {
  if (!(lo > 0) || !(hi > lo)) return nice_ticks(lo, hi, 4);
  std::vector<double> ticks;
  const int k0 = static_cast<int>(std::floor(std::log10(lo)));
  const int k1 = static_cast<int>(std::ceil(std::log10(hi)));
  const bool minor = k1 - k0 <= 3;
  for (int k = k0; k <= k1; ++k)
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && !minor) continue;
      const double v = m * std::pow(10.0, k);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) ticks.push_back(v);
    }
  if (ticks.size() < 2) return nice_ticks(lo, hi, 4);
  return ticks;
}

std::string format_number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e3) {
    const char* suffix[] = {"k", "M", "G", "T", "P"};
    int i = -1;
    double s = v;
    while (std::abs(s) >= 1e3 && i < 4) {
      s /= 1e3;
      ++i;
    }
    return fmt::format("{:.3g}{}", s, suffix[i]);
  }
  if (a < 1e-2) {
    int exponent = static_cast<int>(std::floor(std::log10(a)));
    double mantissa = v / std::pow(10.0, exponent);
    if (std::abs(mantissa) >= 9.995) {  // rounds up to 10 in {:.3g}
      mantissa /= 10;
      ++exponent;
    }
    return fmt::format("{:.3g}e{}", mantissa, exponent);
  }
  return fmt::format("{:.4g}", v);
}

namespace {

// The length of the valid UTF-8 sequence at s[i] (i < s.size()), 0 when there is none: the lead
// byte gives the length, each continuation byte is checked, and overlong forms and surrogates are
// refused (the second byte's narrower ranges).
size_t utf8_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  }
  if (len == 0 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return len;
}

const char* const kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_length(s, i);
    if (len == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_length(s, i);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (len > 1) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    const char c = s[i++];
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '\t':
      case '\n':
        out += c;
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
          out += kReplacement;  // control characters have no place in a page
        else
          out += c;
    }
  }
  return out;
}

std::string truncate_utf8(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "\xE2\x80\xA6";  // …
}

std::string marker(Shape shape, const std::string& color, double cx, double cy, double size,
                   const std::string& title) {
  const double r = size / 2;
  const std::string fill = fmt::format(" fill=\"{}\" stroke=\"#fff\" stroke-width=\"0.8\"", color);
  const std::string line = fmt::format(" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"", color);
  auto polygon = [&](std::vector<Point> pts) {
    std::string p;
    for (const auto& q : pts) p += num(cx + q.x * r) + "," + num(cy + q.y * r) + " ";
    return with_title("<polygon points=\"" + p + "\"" + fill, "polygon", title);
  };
  switch (shape) {
    case Shape::kCircle:
      return with_title(
          fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"{}\"{}", num(cx), num(cy), num(r), fill),
          "circle", title);
    case Shape::kSquare:
      return with_title(
          fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"{}", num(cx - r * 0.9),
                      num(cy - r * 0.9), num(size * 0.9), num(size * 0.9), fill),
          "rect", title);
    case Shape::kTriangleUp:
      return polygon({{0, -1.1}, {1, 0.75}, {-1, 0.75}});
    case Shape::kTriangleRight:
      return polygon({{1.1, 0}, {-0.75, 1}, {-0.75, -1}});
    case Shape::kTriangleLeft:
      return polygon({{-1.1, 0}, {0.75, 1}, {0.75, -1}});
    case Shape::kDiamond:
      return polygon({{0, -1.2}, {1, 0}, {0, 1.2}, {-1, 0}});
    case Shape::kCross:
      return with_title(fmt::format("<path d=\"M{} {}L{} {}M{} {}L{} {}\"{}", num(cx - r),
                                    num(cy - r), num(cx + r), num(cy + r), num(cx - r), num(cy + r),
                                    num(cx + r), num(cy - r), line),
                        "path", title);
    case Shape::kTick:
      return with_title(fmt::format("<path d=\"M{} {}V{}\"{}", num(cx), num(cy - r * 1.2),
                                    num(cy + r * 1.2), line),
                        "path", title);
  }
  return "";
}

std::string legend_marker(Shape shape, const std::string& color) {
  return "<svg class=\"key\" width=\"14\" height=\"14\" viewBox=\"0 0 14 14\">" +
         marker(shape, color, 7, 7, 10, "") + "</svg>";
}

std::string legend_line(const std::string& color, double width, const std::string& dash,
                        double opacity) {
  return fmt::format(
      "<svg class=\"key\" width=\"26\" height=\"14\" viewBox=\"0 0 26 14\"><path d=\"M1 7H25\" "
      "stroke=\"{}\" stroke-width=\"{}\" stroke-opacity=\"{}\"{}/></svg>",
      color, width, opacity, dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"");
}

std::string legend_swatch(const std::string& color, double opacity) {
  return fmt::format(
      "<svg class=\"key\" width=\"18\" height=\"14\" viewBox=\"0 0 18 14\"><rect x=\"1\" y=\"1\" "
      "width=\"16\" height=\"12\" fill=\"{}\" fill-opacity=\"{}\"/></svg>",
      color, opacity);
}

Plot::Plot(std::string id, double width, double height, Axis x, Axis y, double left_margin)
    : id_(std::move(id)),
      width_(width),
      height_(height),
      x_(std::move(x)),
      y_(std::move(y)),
      left_(left_margin) {
  if (!std::isfinite(x_.lo) || !std::isfinite(x_.hi)) x_.lo = 0, x_.hi = 1;
  if (x_.hi <= x_.lo) x_.hi = x_.lo + 1;
  if (y_.log && !(y_.lo > 0)) y_.lo = y_.hi > 0 ? y_.hi / 10 : 1e-3;
  if (!std::isfinite(y_.lo) || !std::isfinite(y_.hi)) y_.lo = 0, y_.hi = 1;
  if (y_.hi <= y_.lo) {
    const double pad = y_.lo == 0 ? 1 : std::abs(y_.lo) * 0.1;
    y_.hi = y_.lo + pad;
    if (!y_.log) y_.lo -= pad;
  }
}

double Plot::px(double x) const {
  const double w = width_ - left_ - right_;
  return left_ + (x - x_.lo) / (x_.hi - x_.lo) * w;
}

double Plot::py(double y) const {
  const double h = height_ - top_ - bottom_;
  double t;
  if (y_.log) {
    if (!(y > 0)) return top_ + h;
    t = (std::log10(y) - std::log10(y_.lo)) / (std::log10(y_.hi) - std::log10(y_.lo));
  } else {
    t = (y - y_.lo) / (y_.hi - y_.lo);
  }
  return top_ + (1 - t) * h;
}

void Plot::line(const std::vector<Point>& points, const std::string& color, double width,
                const std::string& dash, double opacity, const std::string& title) {
  std::string d;
  bool pen_down = false;
  for (const auto& p : points) {
    if (!std::isfinite(p.x) || !std::isfinite(p.y) || (y_.log && !(p.y > 0))) {
      pen_down = false;
      continue;
    }
    d += (pen_down ? "L" : "M") + num(px(p.x)) + " " + num(py(p.y));
    pen_down = true;
  }
  if (d.empty()) return;
  content_ +=
      with_title(fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" "
                             "stroke-opacity=\"{}\" stroke-linejoin=\"round\"{}",
                             d, color, width, opacity,
                             dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\""),
                 "path", title);
  content_ += "\n";
}

void Plot::stems(const std::vector<Point>& points, const std::string& color, double width,
                 const std::string& title) {
  const double base = py(y_.log ? y_.lo : std::max(0.0, y_.lo));
  std::string d;
  for (const auto& p : points)
    if (std::isfinite(p.x) && std::isfinite(p.y) && p.y != 0)
      d += "M" + num(px(p.x)) + " " + num(base) + "V" + num(py(p.y));
  if (d.empty()) return;
  content_ +=
      with_title(fmt::format("<path d=\"{}\" stroke=\"{}\" stroke-width=\"{}\"", d, color, width),
                 "path", title);
  content_ += "\n";
}

void Plot::band(const std::vector<Point>& lower, const std::vector<Point>& upper,
                const std::string& color, double opacity, const std::string& title) {
  std::string pts;
  auto clamp_y = [&](double y) { return std::clamp(py(y), top_ - 2, height_ - bottom_ + 2); };
  for (const auto& p : upper)
    if (std::isfinite(p.x) && std::isfinite(p.y))
      pts += num(px(p.x)) + "," + num(clamp_y(p.y)) + " ";
  for (auto it = lower.rbegin(); it != lower.rend(); ++it)
    if (std::isfinite(it->x) && std::isfinite(it->y))
      pts += num(px(it->x)) + "," + num(clamp_y(it->y)) + " ";
  if (pts.empty()) return;
  underlay_ += with_title(
      fmt::format("<polygon points=\"{}\" fill=\"{}\" fill-opacity=\"{}\"", pts, color, opacity),
      "polygon", title);
  underlay_ += "\n";
}

void Plot::x_span(double x0, double x1, const std::string& color, double opacity,
                  const std::string& title) {
  const double a = std::clamp(px(x0), left_, width_ - right_);
  const double b = std::clamp(px(x1), left_, width_ - right_);
  if (b <= a && x1 < x0) return;
  underlay_ +=
      with_title(fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
                             "fill-opacity=\"{}\"",
                             num(a), num(top_), num(std::max(b - a, 1.5)),
                             num(height_ - top_ - bottom_), color, opacity),
                 "rect", title);
  underlay_ += "\n";
}

void Plot::x_rule(double x, const std::string& color, double opacity, const std::string& title) {
  if (x < x_.lo || x > x_.hi) return;
  underlay_ +=
      with_title(fmt::format("<path d=\"M{} {}V{}\" stroke=\"{}\" stroke-opacity=\"{}\" "
                             "stroke-width=\"1\"",
                             num(px(x)), num(top_), num(height_ - bottom_), color, opacity),
                 "path", title);
  underlay_ += "\n";
}

void Plot::y_rule(double y, const std::string& color, const std::string& label,
                  const std::string& title) {
  if (!std::isfinite(y) || y < y_.lo || y > y_.hi) return;
  const double yy = py(y);
  content_ += with_title(fmt::format("<path d=\"M{} {}H{}\" stroke=\"{}\" stroke-width=\"1.5\" "
                                     "stroke-dasharray=\"6 4\"",
                                     num(left_), num(yy), num(width_ - right_), color),
                         "path", title);
  if (!label.empty())
    overlay_ += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"{}\" class=\"rule-label\">{}</text>\n",
        num(width_ - right_ - 4), num(yy - 4), color, escape(label));
}

void Plot::mark(Shape shape, const std::string& color, double x, double y, double size,
                const std::string& title) {
  if (!std::isfinite(x)) return;
  const double cx = std::clamp(px(x), left_, width_ - right_);
  const double cy =
      std::isfinite(y) ? std::clamp(py(y), top_ + size / 2, height_ - bottom_) : top_ + size / 2;
  overlay_ += marker(shape, color, cx, cy, size, title) + "\n";
}

void Plot::hover_column(double x0, double x1, const std::string& title) {
  const double a = std::clamp(px(x0), left_, width_ - right_);
  const double b = std::clamp(px(x1), left_, width_ - right_);
  hover_ += with_title(
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
                  "fill=\"#000\" fill-opacity=\"0\"",
                  num(a), num(top_), num(std::max(b - a, 1.0)), num(height_ - top_ - bottom_)),
      "rect", title);
}

double Plot::lane_y(int lane, int lanes) const {
  const double h = height_ - top_ - bottom_;
  return top_ + (lane + 0.5) * h / std::max(lanes, 1);
}

void Plot::lane_label(int lane, int lanes, const std::string& text) {
  const double y = lane_y(lane, lanes);
  underlay_ += fmt::format("<path d=\"M{} {}H{}\" stroke=\"#eef0f3\" stroke-width=\"1\"/>\n",
                           num(left_), num(y), num(width_ - right_));
  overlay_ += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\" "
      "class=\"lane-label\">{}</text>\n",
      num(left_ - 8), num(y), escape(text));
}

void Plot::lane_mark(int lane, int lanes, Shape shape, const std::string& color, double x,
                     const std::string& title) {
  if (!std::isfinite(x)) return;
  overlay_ += marker(shape, color, std::clamp(px(x), left_, width_ - right_), lane_y(lane, lanes),
                     10, title) +
              "\n";
}

void Plot::lane_arrow(int lane, int lanes, double x_from, double x_to, const std::string& color,
                      const std::string& title) {
  const double y = lane_y(lane, lanes);
  const double a = std::clamp(px(x_from), left_, width_ - right_);
  const double b = std::clamp(px(x_to), left_, width_ - right_);
  const double head = a > b ? 5 : -5;  // the head points at x_to
  overlay_ += with_title(fmt::format("<path d=\"M{} {}H{}M{} {}L{} {}L{} {}\" fill=\"none\" "
                                     "stroke=\"{}\" stroke-width=\"1.5\"",
                                     num(a), num(y), num(b), num(b + head), num(y - 4), num(b),
                                     num(y), num(b + head), num(y + 4), color),
                         "path", title);
  overlay_ += "\n";
}

std::string Plot::render() const {
  const double x0 = left_, x1 = width_ - right_, y0 = top_, y1 = height_ - bottom_;
  std::string out = fmt::format(
      "<svg id=\"{0}\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {1} {2}\" "
      "preserveAspectRatio=\"xMidYMid meet\" role=\"img\">\n"
      "<defs><clipPath id=\"{0}-clip\"><rect x=\"{3}\" y=\"{4}\" width=\"{5}\" height=\"{6}\"/>"
      "</clipPath></defs>\n"
      "<rect x=\"{3}\" y=\"{4}\" width=\"{5}\" height=\"{6}\" fill=\"#fff\"/>\n",
      escape(id_), num(width_), num(height_), num(x0), num(y0), num(x1 - x0), num(y1 - y0));
  out += "<g clip-path=\"url(#" + escape(id_) + "-clip)\">\n" + underlay_ + "</g>\n";
  // Grid and tick labels.
  std::string grid, labels;
  const auto yticks = !y_.ticks ? std::vector<double>{}
                      : y_.log  ? log_ticks(y_.lo, y_.hi)
                                : nice_ticks(y_.lo, y_.hi, 5);
  for (double t : yticks) {
    const double y = py(t);
    if (y < y0 - 0.5 || y > y1 + 0.5) continue;
    grid += "M" + num(x0) + " " + num(y) + "H" + num(x1);
    labels += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>",
        num(x0 - 6), num(y), escape(format_number(t)));
  }
  const int xtarget = std::max(2, static_cast<int>((x1 - x0) / 110));
  for (double t : nice_ticks(x_.lo, x_.hi, xtarget)) {
    const double x = px(t);
    if (x < x0 - 0.5 || x > x1 + 0.5) continue;
    grid += "M" + num(x) + " " + num(y0) + "V" + num(y1);
    labels += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", num(x),
                          num(y1 + 15), escape(format_number(t)));
  }
  out += "<path class=\"grid\" d=\"" + grid + "\" stroke=\"#e6e8eb\" stroke-width=\"1\"/>\n";
  out += "<g class=\"ticks\">" + labels + "</g>\n";
  if (!x_.label.empty())
    out += fmt::format(
        "<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        num((x0 + x1) / 2), num(height_ - 3), escape(x_.label));
  if (!y_.label.empty())
    out += fmt::format(
        "<text class=\"axis-label\" transform=\"translate(12 {}) rotate(-90)\" "
        "text-anchor=\"middle\">{}</text>\n",
        num((y0 + y1) / 2), escape(y_.label));
  out += "<g clip-path=\"url(#" + escape(id_) + "-clip)\">\n" + content_ + "</g>\n";
  out += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#9aa1ab\"/>\n",
      num(x0), num(y0), num(x1 - x0), num(y1 - y0));
  out += "<g class=\"hover\">" + hover_ + "</g>\n";
  out += overlay_;
  out += "</svg>\n";
  return out;
}

}  // namespace keel::report::svg
