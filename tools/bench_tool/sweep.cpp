#include "tools/bench_tool/sweep.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tools/bench_tool/svg_plot.hpp"

namespace troupe::bench_tool {

sweep_spec parse_sweep(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    throw std::invalid_argument("--sweep '" + text + "' is not key=v1,v2,... (e.g. rate=1,2,4)");
  }
  sweep_spec spec;
  spec.key = text.substr(0, eq);
  std::stringstream in(text.substr(eq + 1));
  std::string value;
  while (std::getline(in, value, ',')) {
    if (value.empty()) throw std::invalid_argument("--sweep '" + text + "' has an empty value");
    if (spec.is_rate()) {
      size_t used = 0;
      double rate = 0;
      try {
        rate = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !(rate > 0)) {
        throw std::invalid_argument("--sweep rate: '" + value + "' is not a request rate above 0");
      }
    }
    spec.values.push_back(value);
  }
  return spec;
}

namespace {

std::string num(double v) {
  if (!std::isfinite(v)) return v > 0 ? "inf" : "";
  std::ostringstream out;
  out.precision(6);
  out << v;
  return out.str();
}

void add_stats(std::ostringstream& out, const latency_stats& s) {
  out << ',' << num(s.mean * 1e3) << ',' << num(s.median * 1e3) << ',' << num(s.p90 * 1e3) << ',' << num(s.p99 * 1e3);
}

}  // namespace

std::vector<sweep_row> best_rounds(const sweep_spec& spec, const std::vector<sweep_row>& rows) {
  std::vector<sweep_row> best;
  for (const auto& value : spec.values) {
    const sweep_row* pick = nullptr;
    for (const auto& r : rows) {
      if (r.value != value || r.summary.num_completed == 0) continue;
      if (!pick || r.summary.e2e.median < pick->summary.e2e.median) pick = &r;
    }
    if (pick) best.push_back(*pick);
  }
  return best;
}

std::string sweep_csv(const sweep_spec& spec, const std::vector<sweep_row>& rows) {
  std::ostringstream out;
  out << spec.key
      << ",round,offered_rate,concurrency,completed,errors,duration_s,request_throughput,input_throughput,output_"
         "throughput";
  for (const char* m : {"ttft", "tpot", "itl", "e2e"}) {
    out << ',' << m << "_mean_ms," << m << "_median_ms," << m << "_p90_ms," << m << "_p99_ms";
  }
  out << ",slo_attainment,goodput_rate\n";
  for (const auto& row : rows) {
    const auto& s = row.summary;
    out << row.value << ',' << row.round << ',' << num(s.offered_rate) << ',' << s.concurrency << ',' << s.num_completed
        << ',' << s.num_errors << ',' << num(s.duration) << ',' << num(s.request_throughput) << ','
        << num(s.input_throughput) << ',' << num(s.output_throughput);
    add_stats(out, s.ttft);
    add_stats(out, s.tpot);
    add_stats(out, s.itl);
    add_stats(out, s.e2e);
    out << ',' << (s.slo_attainment ? num(*s.slo_attainment) : "") << ','
        << (row.goodput_rate ? num(*row.goodput_rate) : "") << '\n';
  }
  return out.str();
}

std::pair<sweep_spec, std::vector<sweep_row>> read_sweep_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open the sweep CSV '" + path + "'");
  std::string line;
  std::getline(in, line);
  auto split = [](const std::string& text) {
    std::vector<std::string> fields;
    std::stringstream ss(text);
    std::string field;
    while (std::getline(ss, field, ',')) fields.push_back(field);
    if (!text.empty() && text.back() == ',') fields.emplace_back();
    return fields;
  };
  const auto header = split(line);
  constexpr size_t num_columns = 28;
  if (header.size() != num_columns || header[1] != "round") {
    throw std::runtime_error("'" + path + "' is not a sweep.csv of this tool (its header: " + line + ")");
  }
  sweep_spec spec;
  spec.key = header[0];
  std::vector<sweep_row> rows;
  int line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    const auto f = split(line);
    if (f.size() != num_columns) {
      throw std::runtime_error("'" + path + "' line " + std::to_string(line_number) + " has " +
                               std::to_string(f.size()) + " fields, not " + std::to_string(num_columns));
    }
    auto number = [&](size_t i) {
      try {
        return f[i] == "inf" ? INFINITY : std::stod(f[i]);
      } catch (const std::exception&) {
        throw std::runtime_error("'" + path + "' line " + std::to_string(line_number) + ": column " + header[i] +
                                 " is not a number: '" + f[i] + "'");
      }
    };
    sweep_row row;
    row.value = f[0];
    row.round = static_cast<int>(number(1));
    run_summary& s = row.summary;
    s.offered_rate = number(2);
    s.concurrency = static_cast<int>(number(3));
    s.num_completed = static_cast<int>(number(4));
    s.num_errors = static_cast<int>(number(5));
    s.num_requests = s.num_completed + s.num_errors;
    s.duration = number(6);
    s.request_throughput = number(7);
    s.input_throughput = number(8);
    s.output_throughput = number(9);
    size_t column = 10;
    for (latency_stats* st : {&s.ttft, &s.tpot, &s.itl, &s.e2e}) {
      st->mean = number(column++) / 1e3;
      st->median = number(column++) / 1e3;
      st->p90 = number(column++) / 1e3;
      st->p99 = number(column++) / 1e3;
    }
    if (!f[26].empty()) s.slo_attainment = number(26);
    if (!f[27].empty()) row.goodput_rate = number(27);
    if (std::find(spec.values.begin(), spec.values.end(), row.value) == spec.values.end())
      spec.values.push_back(row.value);
    rows.push_back(std::move(row));
  }
  return {spec, rows};
}

std::vector<std::string> write_sweep_outputs(const std::string& dir, const sweep_spec& spec,
                                             const std::vector<sweep_row>& all_rows, bool with_slo) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& content) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path);
    if (!(out << content)) throw std::runtime_error("cannot write " + path);
    written.push_back(path);
  };
  write("sweep.csv", sweep_csv(spec, all_rows));
  const std::vector<sweep_row> rows = best_rounds(spec, all_rows);

  std::vector<std::string> labels;
  std::vector<double> throughput, request_throughput, rate;
  for (const auto& r : rows) {
    labels.push_back(r.value);  // the title names the key
    throughput.push_back(r.summary.output_throughput);
    request_throughput.push_back(r.summary.request_throughput);
    rate.push_back(spec.is_rate() ? std::stod(r.value) : r.summary.request_throughput);
  }
  auto series = [&](const std::string& name, auto pick, bool labelled) {
    plot_series s;
    s.name = name;
    s.x = throughput;
    for (const auto& r : rows) s.y.push_back(pick(r.summary) * 1e3);
    if (labelled) s.labels = labels;
    return s;
  };
  plot_spec latency;
  latency.title = "Latency against throughput (" + spec.key + " sweep)";
  latency.x_label = "output throughput (tokens/s)";
  latency.y_label = "latency (ms)";
  latency.series = {series(
                        "TTFT median", [](const run_summary& s) { return s.ttft.median; }, true),
                    series(
                        "TTFT p99", [](const run_summary& s) { return s.ttft.p99; }, false),
                    series(
                        "E2E median", [](const run_summary& s) { return s.e2e.median; }, false)};
  write("latency_vs_throughput.svg", render_svg(latency));

  plot_spec tpot;
  tpot.title = "Time per output token against throughput (" + spec.key + " sweep)";
  tpot.x_label = "output throughput (tokens/s)";
  tpot.y_label = "TPOT (ms)";
  tpot.series = {series(
                     "TPOT median", [](const run_summary& s) { return s.tpot.median; }, true),
                 series(
                     "TPOT p99", [](const run_summary& s) { return s.tpot.p99; }, false),
                 series(
                     "ITL p99", [](const run_summary& s) { return s.itl.p99; }, false)};
  write("tpot_vs_throughput.svg", render_svg(tpot));

  // A server setting that is a number (a token budget, a batch size): latency against the setting
  // itself, on a log2 axis since such sweeps double.
  bool numeric = !spec.is_rate() && !rows.empty();
  std::vector<double> setting;
  for (const auto& r : rows) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(r.value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    numeric = numeric && used == r.value.size() && v > 0;
    setting.push_back(v);
  }
  if (numeric) {
    auto by_setting = [&](const std::string& name, auto pick) {
      plot_series s;
      s.name = name;
      s.x = setting;
      for (const auto& r : rows) s.y.push_back(pick(r.summary) * 1e3);
      return s;
    };
    plot_spec ttft_plot;
    ttft_plot.title = "Time to first token against " + spec.key;
    ttft_plot.x_label = spec.key;
    ttft_plot.y_label = "TTFT (ms)";
    ttft_plot.x_log2 = true;
    ttft_plot.series = {by_setting("TTFT median", [](const run_summary& s) { return s.ttft.median; }),
                        by_setting("TTFT p99", [](const run_summary& s) { return s.ttft.p99; })};
    write("ttft_vs_" + spec.key + ".svg", render_svg(ttft_plot));
    plot_spec tpot_plot;
    tpot_plot.title = "Time per output token against " + spec.key;
    tpot_plot.x_label = spec.key;
    tpot_plot.y_label = "TPOT (ms)";
    tpot_plot.x_log2 = true;
    tpot_plot.series = {by_setting("TPOT median", [](const run_summary& s) { return s.tpot.median; }),
                        by_setting("TPOT p99", [](const run_summary& s) { return s.tpot.p99; }),
                        by_setting("ITL p99", [](const run_summary& s) { return s.itl.p99; })};
    write("tpot_vs_" + spec.key + ".svg", render_svg(tpot_plot));
  }

  if (with_slo) {
    plot_spec attainment;
    attainment.title = "SLO attainment against request rate";
    attainment.x_label = spec.is_rate() ? "offered request rate (req/s)" : "request throughput (req/s)";
    attainment.y_label = "requests meeting the SLO (%)";
    attainment.y_max = 100;
    plot_series s;
    s.name = "SLO attainment";
    s.x = rate;
    for (const auto& r : rows) s.y.push_back(r.summary.slo_attainment.value_or(0) * 100);
    if (!spec.is_rate()) s.labels = labels;
    plot_series target;
    target.name = "90 % target";
    if (!rate.empty()) {
      target.x = {*std::min_element(rate.begin(), rate.end()), *std::max_element(rate.begin(), rate.end())};
      target.y = {90, 90};
    }
    attainment.series = {s, target};
    write("slo_attainment_vs_rate.svg", render_svg(attainment));
  }
  bool any_goodput = false;
  for (const auto& r : rows) any_goodput = any_goodput || r.goodput_rate.has_value();
  if (any_goodput && !spec.is_rate()) {
    plot_spec goodput;
    goodput.title = "Goodput against " + spec.key;
    goodput.x_label = spec.key;
    goodput.y_label = "goodput (req/s at >= 90 % SLO attainment)";
    plot_series s;
    s.name = "goodput";
    for (const auto& r : rows) {
      double x = 0;
      try {
        x = std::stod(r.value);
      } catch (const std::exception&) {
        x = static_cast<double>(s.x.size());
      }
      s.x.push_back(x);
      s.y.push_back(r.goodput_rate.value_or(0));
    }
    goodput.series = {s};
    write("goodput_vs_" + spec.key + ".svg", render_svg(goodput));
  }
  return written;
}

}  // namespace troupe::bench_tool
