#include "stages/detokenize_stage.hpp"

namespace troupe {

std::string detokenize_stage::spell(live_request& request, token_delta& delta, bool& matched) {
  std::string text;
  // A stop token ends the text; it is reported among the ids but not spelled out.
  size_t num_spelled = delta.token_ids.size();
  if (delta.finish == finish_reason::stop && num_spelled > 0) --num_spelled;
  size_t num_kept = delta.token_ids.size();
  for (size_t k = 0; k < num_spelled && !matched; ++k) {
    auto step = request.matcher.push(request.detokenizer.push(delta.token_ids[k]));
    text += step.text;
    if (step.matched) {
      matched = true;
      num_kept = k + 1;  // the token that completed the stop string is the last one reported
    }
  }
  if (!matched && delta.finished()) {
    auto step = request.matcher.push(request.detokenizer.finish());
    text += step.text;
    matched = step.matched;
    text += request.matcher.finish();  // the request ended otherwise: release the held tail
  }
  delta.token_ids.resize(num_kept);
  if (delta.logprobs.size() > num_kept) delta.logprobs.resize(num_kept);
  request.num_output_tokens += static_cast<int>(num_kept);
  return text;
}

detokenize_stage::~detokenize_stage() {
  for (const auto& [id, request] : live_) forget(id);
}

void detokenize_stage::forget(int64_t request_id) {
  if (plugins_) plugins_->end_request(request_id);
}

void detokenize_stage::resume(const detokenizer_resume_msg& resume) {
  if (live_.erase(resume.request_id)) forget(resume.request_id);
  live_request& request =
      live_.try_emplace(resume.request_id, tokenizer_, resume.stop, resume.skip_special_tokens).first->second;
  // The output hooks see that text again, a token's text a call, their answer discarded (the
  // client has it): a plugin's state for the request (a redactor's held-back start of a word) is
  // rebuilt, not lost with the old stage. Token by token, not in one call: a plugin may bound what
  // it holds by the size of a call (the redactor releases past 256 bytes). A failure shows on the
  // next delta, as it would have on the lost stage.
  for (int32_t id : resume.spelled_ids) {
    std::string text = request.matcher.push(request.detokenizer.push(id)).text;
    if (plugins_ && !text.empty()) (void)plugins_->on_output(resume.request_id, text, /*is_final=*/false);
  }
  request.num_output_tokens = static_cast<int>(resume.spelled_ids.size());
}

detokenize_stage::outputs detokenize_stage::run(token_batch batch) {
  outputs out;
  out.texts.deltas.reserve(batch.deltas.size());
  for (size_t i = 0; i < batch.deltas.size(); ++i) {
    token_delta& delta = batch.deltas[i];
    const request_timeline timeline = i < batch.timelines.size() ? batch.timelines[i] : request_timeline{};
    auto it = live_.find(delta.request_id);
    if (it == live_.end()) {
      it = live_.try_emplace(delta.request_id, tokenizer_, std::move(delta.stop), delta.skip_special_tokens).first;
    }
    delta.stop.clear();
    live_request& request = it->second;

    if (request.failed) {
      // A plugin failed it and the client has the error: the scheduler's final only ends it here.
      if (delta.finished()) {
        live_.erase(it);
        forget(delta.request_id);
      }
      continue;
    }
    if (request.stopped_final) {
      // Matched already: only the scheduler's final matters, and it adds the metrics.
      if (!delta.finished()) continue;
      text_delta final_delta = std::move(*request.stopped_final);
      final_delta.delta.metrics = std::move(delta.metrics);
      if (final_delta.delta.metrics) final_delta.delta.metrics->num_output_tokens = request.num_output_tokens;
      final_delta.timeline = timeline;
      live_.erase(it);
      forget(final_delta.delta.request_id);
      out.texts.deltas.push_back(std::move(final_delta));
      continue;
    }

    const bool ended_by_scheduler = delta.finished();
    bool matched = false;
    text_delta text;
    text.text = spell(request, delta, matched);
    if (plugins_ && (!text.text.empty() || matched || delta.finished())) {
      auto verdict = plugins_->on_output(delta.request_id, text.text, /*is_final=*/matched || delta.finished());
      if (verdict && verdict->what == plugin_verdict::kind::failed) {
        // The client's one reply is the error; the scheduler is asked to end the request.
        out.failures.push_back(request_failed{delta.request_id, error_code::internal, std::move(verdict->message)});
        if (ended_by_scheduler) {
          live_.erase(it);
          forget(delta.request_id);
        } else {
          request.failed = true;
          out.stopped_ids.push_back(delta.request_id);
        }
        continue;
      }
      if (verdict && !matched && !ended_by_scheduler) {
        // Stopped by the plugin: as a stop string's match, with the text it left as the last.
        matched = true;
        delta.finish = finish_reason::stop;
        if (delta.metrics) delta.metrics->num_output_tokens = request.num_output_tokens;
      }
    }
    if (matched) {
      delta.finish = finish_reason::stop;
      if (delta.metrics) delta.metrics->num_output_tokens = request.num_output_tokens;
    }
    if (matched && !ended_by_scheduler) {
      text.delta = std::move(delta);
      request.stopped_final = std::move(text);
      out.stopped_ids.push_back(it->first);
      continue;
    }
    if (delta.finished()) {
      text.timeline = timeline;
      live_.erase(it);
      forget(delta.request_id);
    }
    text.delta = std::move(delta);
    out.texts.deltas.push_back(std::move(text));
  }
  // A failed request gets no final delta, and a text held after a stop-string match is dropped:
  // the client's one reply is the error.
  for (request_failed& failure : batch.failures) {
    if (live_.erase(failure.request_id)) forget(failure.request_id);
    out.failures.push_back(std::move(failure));
  }
  return out;
}

}  // namespace troupe
