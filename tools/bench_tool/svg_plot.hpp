#pragma once
// A line chart as a hand-written SVG file: a few series of (x, y) points on linear axes, each
// point optionally labelled (the sweep's value), with a legend. Enough for the sweep's plots,
// with no plotting library to install.

#include <optional>
#include <string>
#include <vector>

namespace troupe::bench_tool {

struct plot_series {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
  std::vector<std::string> labels;  // one per point, or empty
};

struct plot_spec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<plot_series> series;
  double y_min_at_most = 0.0;   // the y axis starts at or below this (0: from zero)
  std::optional<double> y_max;  // a fixed top (100 for percentages), else from the data
  bool x_log2 = false;          // x on a log2 axis (settings that double: 32, 64, ..., 512)
};

std::string render_svg(const plot_spec& spec);

}  // namespace troupe::bench_tool
