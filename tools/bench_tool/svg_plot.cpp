#include "tools/bench_tool/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace troupe::bench_tool {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string fmt(double v) {
  char b[32];
  if (std::fabs(v) >= 100 || v == std::floor(v))
    std::snprintf(b, sizeof b, "%.0f", v);
  else if (std::fabs(v) >= 10)
    std::snprintf(b, sizeof b, "%.1f", v);
  else
    std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

// A step of 1, 2 or 5 times a power of ten giving about five ticks over the span.
double nice_step(double span) {
  if (!(span > 0)) return 1;
  const double raw = span / 5;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

const char* const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace

std::string render_svg(const plot_spec& input) {
  // A log2 axis is a linear axis of log2(x) whose ticks are labelled 2^k.
  plot_spec spec = input;
  if (spec.x_log2) {
    for (auto& s : spec.series) {
      for (auto& x : s.x) x = x > 0 ? std::log2(x) : std::numeric_limits<double>::quiet_NaN();
    }
  }
  auto tick_label = [&](double x) { return fmt(spec.x_log2 ? std::exp2(x) : x); };
  const double width = 720, height = 440, left = 80, right = 190, top = 50, bottom = 60;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
  double y_min = spec.y_min_at_most, y_max = -std::numeric_limits<double>::infinity();
  for (const auto& s : spec.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]);
      x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]);
      y_max = std::max(y_max, s.y[i]);
    }
  }
  if (!std::isfinite(x_min)) x_min = 0, x_max = 1, y_max = 1;
  if (spec.y_max) y_max = *spec.y_max;
  if (x_max <= x_min) x_max = x_min + 1;
  if (y_max <= y_min) y_max = y_min + 1;
  const double x_step = spec.x_log2 ? std::max(1.0, std::round(nice_step(x_max - x_min))) : nice_step(x_max - x_min);
  const double y_step = nice_step(y_max - y_min);
  x_min = std::floor(x_min / x_step) * x_step;
  x_max = std::ceil(x_max / x_step) * x_step;
  y_min = std::floor(y_min / y_step) * y_step;
  y_max = std::ceil(y_max / y_step) * y_step;
  auto px = [&](double x) { return left + (x - x_min) / (x_max - x_min) * plot_w; };
  auto py = [&](double y) { return top + plot_h - (y - y_min) / (y_max - y_min) * plot_h; };

  std::string svg;
  char b[512];
  std::snprintf(
      b, sizeof b,
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  svg += b;
  svg += "<text x=\"" + fmt(width / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" + escape(spec.title) +
         "</text>\n";
  // Grid and ticks.
  for (double x = x_min; x <= x_max + x_step / 2; x += x_step) {
    std::snprintf(b, sizeof b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                  px(x), top, px(x), top + plot_h, px(x), top + plot_h + 16, tick_label(x).c_str());
    svg += b;
  }
  for (double y = y_min; y <= y_max + y_step / 2; y += y_step) {
    std::snprintf(b, sizeof b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  left, py(y), left + plot_w, py(y), left - 6, py(y) + 4, fmt(y).c_str());
    svg += b;
  }
  std::snprintf(b, sizeof b,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", left,
                top, plot_w, plot_h);
  svg += b;
  svg += "<text x=\"" + fmt(left + plot_w / 2) + "\" y=\"" + fmt(height - 18) + "\" text-anchor=\"middle\">" +
         escape(spec.x_label) + "</text>\n";
  svg += "<text transform=\"translate(20," + fmt(top + plot_h / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
         escape(spec.y_label) + "</text>\n";
  // Series.
  for (size_t k = 0; k < spec.series.size(); ++k) {
    const auto& s = spec.series[k];
    const char* color = colors[k % (sizeof colors / sizeof colors[0])];
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      std::snprintf(b, sizeof b, "%.1f,%.1f ", px(s.x[i]), py(s.y[i]));
      points += b;
    }
    svg += std::string("<polyline fill=\"none\" stroke=\"") + color + "\" stroke-width=\"2\" points=\"" + points +
           "\"/>\n";
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      std::snprintf(b, sizeof b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px(s.x[i]), py(s.y[i]),
                    color);
      svg += b;
      if (i < s.labels.size() && !s.labels[i].empty()) {
        std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">%s</text>\n",
                      px(s.x[i]) + 5, py(s.y[i]) - 6, color, escape(s.labels[i]).c_str());
        svg += b;
      }
    }
    std::snprintf(b, sizeof b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                  left + plot_w + 14, top + 14 + 20.0 * k, left + plot_w + 38, top + 14 + 20.0 * k, color,
                  left + plot_w + 44, top + 18 + 20.0 * k, escape(s.name).c_str());
    svg += b;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace troupe::bench_tool
