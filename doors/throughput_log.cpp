#include "doors/throughput_log.hpp"

#include <fmt/format.h>

namespace troupe {

std::optional<throughput_line> throughput_log::next(const throughput_sample& sample) {
  const std::optional<throughput_sample> before = std::exchange(previous_, sample);
  if (!before || sample.at <= before->at) return std::nullopt;
  throughput_line line;
  line.seconds = static_cast<double>(sample.at - before->at) / 1e9;
  // Totals only grow; a smaller one (none here) would read as nothing rather than wrap.
  const auto grown = [](uint64_t now, uint64_t then) { return now > then ? now - then : 0; };
  const uint64_t num_prompt = grown(sample.num_prompt_tokens, before->num_prompt_tokens);
  const uint64_t num_generation = grown(sample.num_generation_tokens, before->num_generation_tokens);
  line.num_finished = grown(sample.num_finished, before->num_finished);
  line.prompt_tokens_per_s = static_cast<double>(num_prompt) / line.seconds;
  line.generation_tokens_per_s = static_cast<double>(num_generation) / line.seconds;
  line.has_engine_gauges = sample.has_engine_gauges;
  if (sample.has_engine_gauges) {
    line.num_running = sample.num_running;
    line.num_waiting = sample.num_waiting;
    if (sample.num_total_blocks > 0) {
      line.kv_used_percent = 100.0 * (sample.num_total_blocks - sample.num_free_blocks) / sample.num_total_blocks;
    }
  }
  const bool busy = line.has_engine_gauges && (line.num_running > 0 || line.num_waiting > 0);
  if (num_prompt == 0 && num_generation == 0 && line.num_finished == 0 && !busy) return std::nullopt;
  return line;
}

std::string throughput_log_text(const throughput_line& l) {
  std::string text = fmt::format("throughput: prompt {:.1f} tok/s, generation {:.1f} tok/s, {} finished over {:.1f} s",
                                 l.prompt_tokens_per_s, l.generation_tokens_per_s, l.num_finished, l.seconds);
  if (l.has_engine_gauges) {
    text +=
        fmt::format("; running {}, waiting {}; KV cache {:.1f}% used", l.num_running, l.num_waiting, l.kv_used_percent);
  }
  return text;
}

nlohmann::json throughput_log_fields(const throughput_line& l) {
  nlohmann::json fields = {{"interval_s", l.seconds},
                           {"prompt_tokens_per_s", l.prompt_tokens_per_s},
                           {"generation_tokens_per_s", l.generation_tokens_per_s},
                           {"finished", l.num_finished}};
  if (l.has_engine_gauges) {
    fields["running"] = l.num_running;
    fields["waiting"] = l.num_waiting;
    fields["kv_used_percent"] = l.kv_used_percent;
  }
  return fields;
}

}  // namespace troupe
